"""Deep Search: multi-turn retrieval QA in the Search-R1 protocol (`env.py`)."""
