"""Build: quantization, engines, memory-pool plan, manifest, model repository.

Entry points: :func:`trtspec.build.pipeline.run_build` (``trtspec build``) and,
for servers loading engines, :func:`trtspec.build.manifest.verify_engines`.
"""
