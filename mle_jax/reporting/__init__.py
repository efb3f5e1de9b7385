"""What people read: a run's report.md and plots, markdown tables, the result tables of README.md, BUILD.md and
docs/*.md rendered from docs/results, the planner's markdown, and the provenance (command, date) every results file
records."""
