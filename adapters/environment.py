"""The environment an engine process starts with: what its kind needs, never the runner's.

An engine (and whatever it runs: vLLM's workers, ComfyUI's custom nodes, a plugin) used to
inherit the runner's whole environment, and with it WEBHOOK_SECRET, GATEWAY_SECRET, the
Redis URL and its password, the cache-salt secret: anything that engine code can read
(`/proc/self/environ`, `os.environ`) it can leak. Now an engine gets only:

1. the names every engine needs (`COMMON`: the search paths, locale, time zone, home,
   temporary folder, GPU selection, CA bundles and proxies);
2. the names its kind declares (`Traits.environment`, e.g. `VLLM_*` for vLLM);
3. the names the operator adds for every engine (`ENGINE_ENV_ALLOW`, comma-separated;
   a trailing `*` is a prefix);

less any name that `NEVER` matches, whatever allowed it (`VLLM_CACHE_SALT_SECRET` is a
`VLLM_*` name), and then what the runner sets for that one engine (its devices, its API
key), which wins. Pure: the caller passes the environment it read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

COMMON = (
    *("PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "TERM"),  # the process
    *("LANG", "LANGUAGE", "LC_*", "TZ"),  # locale and time
    *("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV"),
    *("LD_LIBRARY_PATH", "CUDA_*", "NVIDIA_*", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
    *("OMP_*", "KMP_*", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "XDG_CACHE_HOME"),
    *("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"),  # TLS
    *("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"),
)
"""Step 1: what any engine may need of the host."""

NEVER = ("*SECRET*", "*PASSWORD*", "*PASSWD*", "REDIS_*", "WEBHOOK_*", "GATEWAY_*")
"""Never inherited, whatever allowed it (matched on the name in upper case)."""

OPERATOR_ALLOW = "ENGINE_ENV_ALLOW"


def matches(name: str, patterns: Iterable[str]) -> bool:
    """`name` is one of `patterns`: equal, or starting with a pattern's text before `*`
    (`*TEXT*`: containing it)."""
    for pattern in patterns:
        if pattern.startswith("*") and pattern.endswith("*") and len(pattern) > 2:
            if pattern[1:-1] in name:
                return True
        elif pattern.endswith("*"):
            if name.startswith(pattern[:-1]):
                return True
        elif name == pattern:
            return True
    return False


def engine_environment(
    environ: Mapping[str, str], declared: Iterable[str], added: Mapping[str, str]
) -> dict[str, str]:
    """The environment of an engine process (steps in the module docstring)."""
    operator = [p.strip() for p in environ.get(OPERATOR_ALLOW, "").split(",") if p.strip()]
    allowed = (*COMMON, *declared, *operator)
    env = {
        name: value
        for name, value in environ.items()
        if matches(name, allowed) and not matches(name.upper(), NEVER)
    }
    env.update(added)
    return env
