"""The tgi backend: Hugging Face Text Generation Inference through huggingface_hub's client."""
