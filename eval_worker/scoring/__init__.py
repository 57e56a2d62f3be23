"""Acceptance length (tau): the chain and DDTree walks over cached sequences (`acceptance.py`,
`ddtree.py`), EAGLE's dynamic tree (`eagle_tree.py`), the expected rounds of rejection sampling along
a response (`rejection.py`) and their summary over prompts (`summary.py`).
Pure functions, testable on CPU.
"""
