"""YAML read with ``safe_load`` semantics, keeping the line of every key so that errors can point at it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from resilient_flows.errors import WorkflowError


@dataclass
class YamlSource:
    """A parsed YAML document and where each key and item came from."""

    path: str
    data: Any
    root: yaml.Node | None

    @classmethod
    def read(cls, path: str | Path) -> YamlSource:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise WorkflowError(f"{path}: no such file") from None
        except OSError as exc:
            raise WorkflowError(f"{path}: cannot read it ({exc.strerror})") from None
        return cls.parse(text, str(path))

    @classmethod
    def parse(cls, text: str, where: str) -> YamlSource:
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise WorkflowError(f"{where}{line}: not valid YAML ({problem})") from None
        return cls(where, data, root)

    def line(self, loc: tuple[Any, ...]) -> int | None:
        """The 1-based line of the deepest node along ``loc`` (keys and list indices) that exists."""
        node, line = self.root, None
        for part in loc:
            if node is None:
                break
            line = node.start_mark.line + 1
            if isinstance(node, yaml.MappingNode):
                match = next(((k, v) for k, v in node.value if k.value == str(part)), None)
                if match is None:
                    return line
                line = match[0].start_mark.line + 1
                node = match[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                return line
        return line if line is not None else (node.start_mark.line + 1 if node is not None else None)
