"""A stand-in for the `mlebench` package (openai/mle-bench), just enough to import and run the vendored
`competitions/<id>/grade.py` files and `competitions/utils.py` unchanged: `utils.py` and `grade_helpers.py`
here are ours (the few names those files import), everything under `competitions/` is MLE-bench's (MIT,
see ../LICENSE and ../README.md)."""
