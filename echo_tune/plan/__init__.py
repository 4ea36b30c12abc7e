"""The planner: from a model, a token budget and candidate clusters to a priced, explained layout."""
