"""The checkpoint bundle on disk: layout, manifest, crash-consistent commit, verification, retention, the fence.

Standard library only, but for the `blake3` hash (imported by `checksum` alone): nothing here knows Ray, torch or
TransferQueue; the data plane and the trainer write their files into a bundle and this package makes it a
checkpoint (or refuses to read it as one).
"""
