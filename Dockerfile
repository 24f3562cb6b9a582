# trtspec on NVIDIA's Triton Inference Server image with TensorRT-LLM.
#
# Triton 26.03 is the first release whose `trtllm-python-py3` image ships
# TensorRT-LLM 1.2 (1.2.0); 25.12 and 26.02 ship 1.1.0. trtspec builds engines
# through TensorRT-LLM's engine path (`trtllm-build`), present in 1.0-1.2 only.
# Another 1.x release: docker build --build-arg TRITON_RELEASE=26.04 .
#
#   docker build -t trtspec .
#   docker run --gpus all --shm-size=2g -p 8000-8002:8000-8002 -v $PWD/work:/work trtspec \
#       --model-repo /work/model_repo
#   docker run --gpus all -v $PWD/work:/work --entrypoint trtspec trtspec \
#       build --backend trtllm --target /work/target --draft /work/draft \
#       --engines /work/engines --model-repo /work/model_repo
ARG TRITON_RELEASE=26.03
FROM nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-trtllm-python-py3

ENV PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRTSPEC_CACHE=/var/cache/trtspec

WORKDIR /opt/trtspec
COPY pyproject.toml README.md ./
COPY trtspec ./trtspec

# The image's torch, transformers and tensorrt_llm stay exactly as NVIDIA built
# and matched them: resolving trtspec's own pins (transformers>=5) against
# TensorRT-LLM 1.2's (transformers 4.57) would replace them. So trtspec and its
# `trtllm` extra are installed without dependency resolution, and the small
# pure-Python dependencies the image lacks are added by name.
RUN python3 -m pip install --no-cache-dir --no-deps ".[trtllm]" \
 && python3 -m pip install --no-cache-dir \
        "typer>=0.12" "rich>=13" "pydantic>=2.6" "pyyaml>=6" "safetensors>=0.4" "gguf>=0.10" \
        psutil nvidia-ml-py "tritonclient[http,grpc]" \
 && python3 -c "import tensorrt_llm, trtspec; print('trtspec', trtspec.__version__, 'TensorRT-LLM', tensorrt_llm.__version__)"

EXPOSE 8000 8001 8002
ENTRYPOINT ["trtspec", "serve"]
