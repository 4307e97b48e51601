"""An OpenAI-compatible engine the runner did not start, attached by URL (`engine`)."""
