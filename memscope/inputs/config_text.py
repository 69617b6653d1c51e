"""Reading a config file: bounded size, regular files only, YAML without alias bombs."""

from __future__ import annotations

from typing import Any

from memscope.analysis.static.validation import show

MAX_CONFIG_BYTES = 4 << 20  # a training config is a few KiB
MAX_NESTING = 16  # mapping levels in a config
MAX_YAML_ALIASES = 32  # FlagScale's training YAMLs use none
MAX_YAML_NODES = 100_000  # after alias expansion


def read_config_text(path: str) -> str:
    """The UTF-8 text of ``path``: a regular file of at most :data:`MAX_CONFIG_BYTES`
    (a FIFO, a device such as ``/dev/zero`` or a directory is refused before reading)."""
    from memscope.events.bounded_input import InputRefused, read_regular

    try:
        data = read_regular(path, MAX_CONFIG_BYTES)
    except InputRefused as exc:
        raise ValueError(f"{path}: {exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start})") from None


class YamlRefusal(ValueError):
    """A YAML document the reader refuses (alias bomb, non-string key)."""


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` with limits: at most :data:`MAX_YAML_ALIASES` aliases and
    :data:`MAX_YAML_NODES` nodes once they are expanded, no recursive aliases, string keys
    only. Raises :class:`YamlRefusal` or ``yaml.YAMLError``."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        aliases = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_YAML_ALIASES:
                    line = self.peek_event().start_mark.line + 1
                    raise YamlRefusal(
                        f"YAML line {line}: more than {MAX_YAML_ALIASES} aliases (*name); "
                        "write the values out"
                    )
            return super().compose_node(parent, index)

        def compose_document(self) -> Any:
            node = super().compose_document()
            _expanded_size(node, {}, set())
            return node

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            mapping = super().construct_mapping(node, deep=deep)
            for key in mapping:
                if not isinstance(key, str):
                    raise YamlRefusal(
                        f"YAML line {node.start_mark.line + 1}: key {show(key)} is not a "
                        "string (quote it)"
                    )
            return mapping

    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _expanded_size(node: Any, sizes: dict[int, int], active: set[int]) -> int:
    """Nodes of ``node`` with every alias expanded; refuses past :data:`MAX_YAML_NODES` and
    recursive aliases (memoised: a shared node is counted once per use, computed once)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in active:
        raise YamlRefusal(f"YAML line {node.start_mark.line + 1}: a recursive alias")
    active.add(key)
    total = 1
    if isinstance(node.value, list):
        for item in node.value:
            for child in item if isinstance(item, tuple) else (item,):
                total += _expanded_size(child, sizes, active)
                if total > MAX_YAML_NODES:
                    raise YamlRefusal(
                        f"YAML line {node.start_mark.line + 1}: more than {MAX_YAML_NODES:,} "
                        "values once its aliases are expanded"
                    )
    active.discard(key)
    sizes[key] = total
    return total


def read_yaml(path: str) -> Any:
    """The YAML at ``path`` with the estimator's limits; one-line ``ValueError`` naming it."""
    import yaml

    try:
        return load_yaml(read_config_text(path))
    except YamlRefusal as exc:
        raise ValueError(f"{path}: {exc}") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise ValueError(f"{path}: invalid YAML ({type(exc).__name__})") from None
