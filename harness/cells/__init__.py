"""A plan's cells: the matrix expanded, what this machine is, and what each cell is decided to do here and ends in.
Plain Python: nothing here imports a plan's code."""
