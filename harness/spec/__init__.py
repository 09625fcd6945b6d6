"""The plan language: the plan model, its loading and validation, the matrix of cells, dtypes and tolerances. Plain Python."""
