"""Reports for people: one report as a table (`table.py`), many compared by step (`compare.py`)
and plotted (`plot.py`, matplotlib).
"""
