"""Building multi-image retrieval benchmarks (random and CLIP hard-negative) from datasets on disk.

Sources: MS-COCO, Flickr8k, a plain JSONL, and the bundled synthetic shapes (docs/benchmarks.md).
The CLIP encoder (``posdebias.benchmarks.clip``) is imported only when the
adversarial setting asks for it, so reading a benchmark does not import open_clip.
"""

from posdebias.benchmarks.build import BuildReport, build_benchmark
from posdebias.benchmarks.files import Benchmark, BenchmarkManifest, load_benchmark
from posdebias.benchmarks.shapes import ShapeSpace, generate_shapes_dataset
from posdebias.benchmarks.sources import PoolImage, SourcePool, read_source

__all__ = [
    "Benchmark",
    "BenchmarkManifest",
    "BuildReport",
    "PoolImage",
    "ShapeSpace",
    "SourcePool",
    "build_benchmark",
    "generate_shapes_dataset",
    "load_benchmark",
    "read_source",
]
