"""tools.distributed_prefill with rank 1 failing midway through writing its shards (tests only).

    torchrun --nproc-per-node 2 tests/distributed_fault.py {exit|raise} --data-dir ... FILE...

`exit`: rank 1 dies (os._exit) as it starts its second shard file; `raise`: writing that file fails
with an I/O error, which rank 1 reports to rank 0.
"""

from __future__ import annotations

import errno
import os
import sys

import storage.kv_files as kv_files
from tools.distributed_prefill import main

if __name__ == "__main__":
    mode = sys.argv.pop(1)
    if os.environ.get("RANK") == "1":
        real_write = kv_files.write_safetensors
        files_begun = []

        def failing_write(*args, **kwargs):
            files_begun.append(1)
            if len(files_begun) == 2:
                if mode == "exit":
                    os._exit(3)
                raise OSError(errno.EIO, "injected I/O error")
            return real_write(*args, **kwargs)

        kv_files.write_safetensors = failing_write
    sys.exit(main())
