"""A kind's own configuration, typed models each kind declares in its package
(`adapters/<kind>/settings.py`): its settings (`KindSettings`), read from the environment
the runner was started with (`EngineSettings.environ`) when the runner builds the kind
(`KindFactory`), and its models-file fields (`KindOptions`, `Traits.options`), read from
an entry of its backend by the kind table (runner/engines/kinds.py) into
`EngineSpec.options`.

A field's variable is the model's `env_prefix` and the field's name, upper-cased
(`VllmSettings.bin`: `VLLM_BIN`); names are case-insensitive and an empty value counts as
unset, as for the runner's own settings (runner/floor/settings.py). A bad value stops
the start as any bad setting does: a ConfigError naming each variable and its problem
(`quorum serve` exits 2 with it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from faults import ConfigError


class GivenSettings(BaseSettings):
    """Settings read from the environment they are handed, never the process's behind
    their back (tests pass their own): the runner's (`Settings`) and each kind's."""

    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", frozen=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


class KindSettings(GivenSettings):
    """The base of a kind's settings (subclass: give `env_prefix` and the fields)."""

    @classmethod
    def variables(cls) -> dict[str, str]:
        """Each variable the kind reads, to its field."""
        prefix = str(cls.model_config.get("env_prefix", ""))
        return {f"{prefix}{name}".upper(): name for name in cls.model_fields}

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> Self:
        """The settings `environ` gives (ConfigError naming every bad variable)."""
        names = cls.variables()
        values = {names[k.upper()]: v for k, v in environ.items() if k.upper() in names and v}
        try:
            return cls(**values)
        except ValidationError as exc:
            problems = []
            for err in exc.errors():
                field = str(err["loc"][0]) if err["loc"] else "?"
                name = next((n for n, f in names.items() if f == field), field.upper())
                problems.append(f"{name}={environ.get(name, '')!r}: {err['msg']}")
            raise ConfigError("invalid configuration: " + "; ".join(problems)) from None


class KindOptions(BaseModel):
    """The base of a kind's own models-file fields (subclass: the fields, named as the
    models file writes them); a field no kind declares is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def of(cls, options: KindOptions | None) -> Self:
        """`options` as the kind's own (its defaults when the entry was read without)."""
        return options if isinstance(options, cls) else cls()
