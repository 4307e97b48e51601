"""The data-path benchmark (P1-P3): the same load direct to a fake engine and through the
runner, interleaved in one run. Entry point: `python -m bench.proxy.run`."""
