"""The OpenAI audio API (transcriptions, translations) on the speech engines:
form parsing, audio probing, formats, the ASGI handler and the shared core (service.py)."""
