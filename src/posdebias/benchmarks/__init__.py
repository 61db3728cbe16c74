"""Building multi-image retrieval benchmarks (random and CLIP hard-negative) from datasets on disk.

Sources: MS-COCO, Flickr8k, a plain JSONL, and the bundled synthetic shapes (METHOD.md,
"Benchmarks"). The CLIP encoder (``posdebias.benchmarks.clip``) is imported only when the
adversarial setting asks for it, so reading a benchmark does not import open_clip.
"""
