"""What is deployed: the model (catalogue, Hugging Face configs, quantization), the GPU
(catalogue, custom parts) and the memory plan that follows from both."""
