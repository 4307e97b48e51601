"""The model pool: engines started, watched and stopped for the scheduler (`pool.py`)."""
