"""Image-generation tasks (``task=t2i_color``)."""

TASKS = {
    "t2i_color": "mmrl.tasks.diffusion.t2i_color:T2IColorTask",
}
