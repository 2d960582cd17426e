"""Attention kernels: paged GQA decode (:mod:`.decode`) and its cross-rank combine, distributed
flash decoding (:mod:`.flash_decode`)."""

from .decode import paged_decode

__all__ = ["paged_decode"]
