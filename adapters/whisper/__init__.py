"""faster-whisper behind the runner: worker process (worker.py), its messages
(messages.py), and the runner-side engine (engine.py, transcription.py)."""
