"""The pieces at the ends of the pipeline: the embedding, the output layer and the fused loss.
"""
