"""Build: quantization, engines, memory-pool plan, manifest, model repository.

Entry points: :func:`trtspec.builder.pipeline.run_build` (``trtspec build``) and,
for servers loading engines, :func:`trtspec.builder.manifest.verify_engines`.
"""
