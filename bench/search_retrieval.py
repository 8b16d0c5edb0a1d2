"""BM25 over the generated encyclopedia: index build time and query latency at corpus scale.

    python bench/search_retrieval.py [--people 51000] [--queries 1000]

`--people 51000` gives about 100,000 documents. The build is timed from the documents in
memory to a ready index (bm25s tokenisation and scoring matrix); queries are the questions of
the world and the names of its people, one at a time as the environment sends them.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from agentgym_rl.envs.search.retrieval import BM25Retriever, Doc
from agentgym_rl.envs.search.world import build_world


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--people", type=int, default=51_000)
    parser.add_argument("--queries", type=int, default=1000)
    args = parser.parse_args()
    world = build_world(args.people, questions=args.queries // 2)
    docs = [Doc(a.id, a.title, a.text) for a in world.articles]
    began = time.perf_counter()
    retriever = BM25Retriever(docs)
    build = time.perf_counter() - began
    queries = [q.question for q in world.questions] + sorted(world.people)[: args.queries - len(world.questions)]
    retriever.search(queries[:20], 3)  # warm-up
    latencies = []
    for query in queries:
        began = time.perf_counter()
        retriever.search([query], 3)
        latencies.append(time.perf_counter() - began)
    latencies.sort()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}")
    print("| what | measured |\n|---|---|")
    print(f"| BM25 index build, {len(docs)} documents | {build:.1f} s |")
    print(f"| BM25 query, top 3, {len(queries)} queries one at a time | {1000 * statistics.mean(latencies):.2f} ms mean, "
          f"{1000 * latencies[len(latencies) // 2]:.2f} ms median, {1000 * latencies[int(0.99 * len(latencies))]:.2f} ms p99 |")


if __name__ == "__main__":
    main()
