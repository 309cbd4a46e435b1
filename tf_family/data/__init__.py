"""Bundled real data and the loaders the recipes use."""

from .brown import BROWN_CORPUS_FILE, BROWN_GENRES, load_brown
from .packing import LMBlocks, build_document_streams, pack_into_blocks, schedule_shuffled_batches, schedule_streams
from .sampling import (
    DocumentStreamSampler,
    ExampleDataset,
    SequentialStepSampler,
    ShuffledBlockSampler,
    StepBatchSampler,
    block_loader,
    example_loader,
)
from .sotu import SOTU_CORPUS_FILE, SOTU_TOKENIZER_DIR, load_sotu, read_sotu_records, sotu_split
from .streaming import StreamingBatchDataset, StreamingBlocks, streaming_loader
from .text import BUNDLED_DATASETS, load_text_datasets, load_text_streams

__all__ = [
    "BROWN_CORPUS_FILE",
    "BROWN_GENRES",
    "BUNDLED_DATASETS",
    "DocumentStreamSampler",
    "ExampleDataset",
    "LMBlocks",
    "SOTU_CORPUS_FILE",
    "SOTU_TOKENIZER_DIR",
    "ShuffledBlockSampler",
    "StepBatchSampler",
    "SequentialStepSampler",
    "StreamingBatchDataset",
    "StreamingBlocks",
    "block_loader",
    "build_document_streams",
    "example_loader",
    "load_brown",
    "load_sotu",
    "load_text_datasets",
    "load_text_streams",
    "pack_into_blocks",
    "read_sotu_records",
    "schedule_shuffled_batches",
    "schedule_streams",
    "sotu_split",
    "streaming_loader",
]
