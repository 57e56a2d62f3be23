"""Reports for people: one report as a table (`table.py`), many compared by run and step (`compare.py`,
its tables laid out by `columns.py`, its warnings from `caveats.py`) and plotted (`plot.py`, matplotlib).
Each run is named by `run_label.py`, each tau shown both ways as `conventions.py` labels them, per
sampling setting as `sampling_settings.py` orders them.
"""
