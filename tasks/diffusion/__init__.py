"""Image-generation tasks (``task=t2i_color``)."""
