"""The fit planner (DESIGN.md §6): what a model needs (`footprint`), what this machine has
(`resources`, the planner's only I/O), and the pure function from the two to a placement
(`plan`). It imports nothing of the runtime that executes, so `ft fit` plans before any download.
"""
