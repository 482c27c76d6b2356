"""The study's reporting: reading finished run directories into summaries, the result table, its CSV
/ JSON, the published reference numbers and the plots (`scripts/make_table.py`,
`scripts/reproduce.py`).

Nothing in the library imports this package; it reads what `training` and `evaluation` wrote.
"""
