"""``tools=search``: BM25 retrieval over a local JSON Lines collection (:mod:`bm25s`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from harness.tools.base import TOOLS, ToolConfig, ToolError


@dataclass
class SearchConfig(ToolConfig):
    """``tools=search``: ``<search>query</search>`` -> ``<result>passages</result>``.

    ``path``: a JSON Lines file, one document per line, its text under ``text_key``. The top
    ``top_k`` passages with a positive BM25 score (Robertson et al. 1994, bm25s' default
    "lucene" variant, English stop words removed) are returned, each cut to ``passage_chars``
    characters, one per line as ``[1] text``; none: ``no results``.
    """

    name: str = "search"
    call_open: str = "<search>"
    call_close: str = "</search>"
    path: Optional[str] = None  # the collection (required)
    text_key: str = "text"
    top_k: int = 3
    passage_chars: int = 120


@TOOLS.register("search", params=SearchConfig)
class Search:
    """BM25 search over the collection at ``params.path``, indexed once when built.

    Raises:
        ValueError: ``path`` unset, missing or empty, a line that is not a JSON object with a
            string under ``text_key``, or ``top_k`` / ``passage_chars`` < 1.
        ToolError (on call): none; an empty or stop-word-only query returns ``no results``.
    """

    def __init__(self, params: SearchConfig):
        # imported here, not at the top: bm25s loads numba/llvmlite, whose objects break vLLM's scan
        # of sys.modules when an engine starts (AttributeError in vllm.triton_utils.dispatcher), so
        # only a run with tools=search loads it, after its rollout engine is built
        import bm25s

        if not params.path or not Path(params.path).is_file():
            raise ValueError(f"tools.path={params.path!r}: expected a JSON Lines file of documents")
        if params.top_k < 1 or params.passage_chars < 1:
            raise ValueError(f"tools.top_k={params.top_k}, tools.passage_chars={params.passage_chars}: both must be >= 1")
        self.params, self._bm25s = params, bm25s
        self.docs = []
        for n, line in enumerate(Path(params.path).read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get(params.text_key), str):
                raise ValueError(f"tools.path={params.path!r} line {n}: expected a JSON object with a string "
                                 f"{params.text_key!r} (tools.text_key)")
            self.docs.append(row[params.text_key])
        if not self.docs:
            raise ValueError(f"tools.path={params.path!r}: no documents")
        self.index = bm25s.BM25()
        self.index.index(bm25s.tokenize(self.docs, stopwords="en", show_progress=False), show_progress=False)

    def schema(self) -> dict:
        """The function schema shown to a chat template (``tools.format=chat_template``): one string argument."""
        return {"type": "function", "function": {
            "name": self.params.name,
            "description": f"Search a document collection; returns up to {self.params.top_k} passages.",
            "parameters": {"type": "object", "required": ["query"], "properties": {
                "query": {"type": "string", "description": "the search query"}}}}}

    def __call__(self, query: str) -> str:
        p = self.params
        tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False, return_ids=False)
        if not tokens[0]:
            return "no results"
        docs, scores = self.index.retrieve(tokens, k=min(p.top_k, len(self.docs)), show_progress=False)
        hits = [int(d) for d, s in zip(docs[0], scores[0]) if s > 0]
        if not hits:
            return "no results"
        return "\n".join(f"[{i + 1}] {self.docs[d][: p.passage_chars]}" for i, d in enumerate(hits))
