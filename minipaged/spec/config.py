"""vLLM's ``speculative_config``: which proposer, and how many tokens it may guess per step."""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("ngram",)


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"speculative_config['method']={self.method!r} is not known; "
                             f"choose one of {list(METHODS)}")
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"speculative_config['{name}']={value!r} must be an integer >= 1")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"speculative_config['prompt_lookup_min']={self.prompt_lookup_min} must be <= "
                             f"prompt_lookup_max={self.prompt_lookup_max}")

    @classmethod
    def from_dict(cls, config) -> SpeculativeConfig | None:
        """None stays None; a dict with vLLM's keys becomes a checked config."""
        if config is None or isinstance(config, cls):
            return config
        if not isinstance(config, dict):
            raise ValueError(f"speculative_config must be a dict such as {{'method': 'ngram', "
                             f"'num_speculative_tokens': 4}}, got {type(config).__name__}")
        known = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}
        unknown = sorted(map(str, set(config) - known))
        if unknown:
            raise ValueError(f"speculative_config has unknown keys {unknown}; the known ones are {sorted(known)}")
        return cls(**config)  # __post_init__ checks every field
