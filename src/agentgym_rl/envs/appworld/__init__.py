"""AppWorld (LOOP's benchmark) through the environment server a user runs (`env.py`)."""
