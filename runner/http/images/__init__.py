"""The image routes: OpenAI's images API on ComfyUI models (`handler.py`), wired on the
runner's pool, scheduler and jobs (`routes.py`)."""
