"""The one channel to language models: endpoints, requests within caps, cancellation, usage and the budget."""
