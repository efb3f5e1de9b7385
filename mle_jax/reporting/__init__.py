"""What people read: a run's report.md and plots, markdown tables, README/BUILD result tables rendered from
docs/results, the planner's markdown, and the provenance (command, date) every results file records."""
