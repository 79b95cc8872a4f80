"""Project tools, run from the repository root: the checks `make lint` adds to ruff, mypy
and import-linter (check_import_cycles.py, check_line_budget.py), and the staging scripts
for a lent GPU machine (gpu/)."""
