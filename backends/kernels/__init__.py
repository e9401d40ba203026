"""Triton kernels. Importing this package compiles nothing; each kernel is JIT-compiled (or, with
``TRITON_INTERPRET=1``, interpreted) on first use."""
from backends.kernels.index_convert import convert_req_index_to_global_index
from backends.kernels.sparse_mla_decode import choose_num_splits, sparse_mla_decode

__all__ = ["convert_req_index_to_global_index", "sparse_mla_decode", "choose_num_splits"]
