"""The plan language: the model, its YAML with lines, schema, checks and loading, dtypes and
tolerances. Plain Python (pydantic for the schema): nothing here imports a plan's code."""
