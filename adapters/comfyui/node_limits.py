"""The input limits ComfyUI validates a prompt against, pinned from ComfyUI 0.3.64: the
number bounds (`NODE_LIMITS`) and the fixed choices (`NODE_CHOICES`).

ComfyUI's `POST /prompt` checks each number input against its node's declared `min` and
`max` (`execution.py` `validate_inputs`: the value converted with `int()` / `float()`,
then `value_smaller_than_min` / `value_bigger_than_max`, a 400) before it queues the
prompt. The runner checks the same limits before it accepts a request (`workflows.py`
`within_comfyui`), so an async job is never accepted with a 202 that ComfyUI would then
refuse; a template may not declare bounds beyond them.

The table: every `INT` / `FLOAT` input with a `min` or `max` of the node classes in
ComfyUI's `nodes.py` (31 of its 64 classes have one) and
`comfy_extras/nodes_post_processing.py`, as `GET /object_info` of ComfyUI 0.3.64
(`Comfy-Org/ComfyUI` a125cd84) reports them; `MAX_RESOLUTION` is nodes.py's 16384. A node
class not listed here (another comfy_extras module, a custom node) is checked against the
template's own bounds only: ComfyUI may refuse such a request after its 202.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

MAX_RESOLUTION = 16384  # nodes.py
MAX_SEED = 0xFFFF_FFFF_FFFF_FFFF  # KSampler's seed bound (nodes.py)
COMFYUI_VERSION = "0.3.64"


@dataclass(frozen=True, slots=True)
class Limit:
    """One number input as ComfyUI declares it."""

    kind: Literal["INT", "FLOAT"]
    minimum: float
    maximum: float


def _i(lo: float, hi: float) -> Limit:
    return Limit("INT", lo, hi)


def _f(lo: float, hi: float) -> Limit:
    return Limit("FLOAT", lo, hi)


_RES = MAX_RESOLUTION
_STRENGTH = _f(0.0, 10.0)
_UNIT = _f(0.0, 1.0)
_TILES = {
    "tile_size": _i(64, 4096),
    "overlap": _i(0, 4096),
    "temporal_size": _i(8, 4096),
    "temporal_overlap": _i(4, 4096),
}
_XY = {"x": _i(0, _RES), "y": _i(0, _RES)}

NODE_LIMITS: Mapping[str, Mapping[str, Limit]] = {
    # nodes.py
    "CLIPSetLastLayer": {"stop_at_clip_layer": _i(-24, -1)},
    "ConditioningAverage": {"conditioning_to_strength": _UNIT},
    "ConditioningSetArea": {
        "width": _i(64, _RES),
        "height": _i(64, _RES),
        **_XY,
        "strength": _STRENGTH,
    },
    "ConditioningSetAreaPercentage": {
        "width": _UNIT,
        "height": _UNIT,
        "x": _UNIT,
        "y": _UNIT,
        "strength": _STRENGTH,
    },
    "ConditioningSetAreaStrength": {"strength": _STRENGTH},
    "ConditioningSetMask": {"strength": _STRENGTH},
    "ConditioningSetTimestepRange": {"start": _UNIT, "end": _UNIT},
    "ControlNetApply": {"strength": _STRENGTH},
    "ControlNetApplyAdvanced": {
        "strength": _STRENGTH,
        "start_percent": _UNIT,
        "end_percent": _UNIT,
    },
    "EmptyImage": {
        "width": _i(1, _RES),
        "height": _i(1, _RES),
        "batch_size": _i(1, 4096),
        "color": _i(0, 0xFFFFFF),
    },
    "EmptyLatentImage": {"width": _i(16, _RES), "height": _i(16, _RES), "batch_size": _i(1, 4096)},
    "GLIGENTextBoxApply": {"width": _i(8, _RES), "height": _i(8, _RES), **_XY},
    "ImagePadForOutpaint": {
        "left": _i(0, _RES),
        "top": _i(0, _RES),
        "right": _i(0, _RES),
        "bottom": _i(0, _RES),
        "feathering": _i(0, _RES),
    },
    "ImageScale": {"width": _i(0, _RES), "height": _i(0, _RES)},
    "ImageScaleBy": {"scale_by": _f(0.01, 8.0)},
    "KSampler": {
        "seed": _i(0, MAX_SEED),
        "steps": _i(1, 10000),
        "cfg": _f(0.0, 100.0),
        "denoise": _UNIT,
    },
    "KSamplerAdvanced": {
        "noise_seed": _i(0, MAX_SEED),
        "steps": _i(1, 10000),
        "cfg": _f(0.0, 100.0),
        "start_at_step": _i(0, 10000),
        "end_at_step": _i(0, 10000),
    },
    "LatentBlend": {"blend_factor": _UNIT},
    "LatentComposite": {**_XY, "feather": _i(0, _RES)},
    "LatentCrop": {"width": _i(64, _RES), "height": _i(64, _RES), **_XY},
    "LatentFromBatch": {"batch_index": _i(0, 63), "length": _i(1, 64)},
    "LatentUpscale": {"width": _i(0, _RES), "height": _i(0, _RES)},
    "LatentUpscaleBy": {"scale_by": _f(0.01, 8.0)},
    "LoraLoader": {"strength_model": _f(-100.0, 100.0), "strength_clip": _f(-100.0, 100.0)},
    "LoraLoaderModelOnly": {"strength_model": _f(-100.0, 100.0)},
    "RepeatLatentBatch": {"amount": _i(1, 64)},
    "StyleModelApply": {"strength": _STRENGTH},
    "VAEDecodeTiled": _TILES,
    "VAEEncodeForInpaint": {"grow_mask_by": _i(0, 64)},
    "VAEEncodeTiled": _TILES,
    "unCLIPConditioning": {"strength": _f(-10.0, 10.0), "noise_augmentation": _UNIT},
    # comfy_extras/nodes_post_processing.py
    "ImageBlend": {"blend_factor": _UNIT},
    "ImageBlur": {"blur_radius": _i(1, 31), "sigma": _f(0.1, 10.0)},
    "ImageQuantize": {"colors": _i(1, 256)},
    "ImageScaleToTotalPixels": {"megapixels": _f(0.01, 16.0)},
    "ImageSharpen": {"sharpen_radius": _i(1, 31), "sigma": _f(0.1, 10.0), "alpha": _f(0.0, 5.0)},
}
"""Node class -> input -> its limit. Classes without a number limit (CLIPTextEncode,
CheckpointLoaderSimple, VAEDecode, ImageInvert, SaveImage, ...) are in `NO_LIMITS`."""

NO_LIMITS = frozenset(
    {
        "CLIPLoader",
        "CLIPTextEncode",
        "CLIPVisionEncode",
        "CLIPVisionLoader",
        "CheckpointLoader",
        "CheckpointLoaderSimple",
        "ConditioningCombine",
        "ConditioningConcat",
        "ConditioningZeroOut",
        "ControlNetLoader",
        "DiffControlNetLoader",
        "DiffusersLoader",
        "DualCLIPLoader",
        "GLIGENLoader",
        "ImageBatch",
        "ImageInvert",
        "InpaintModelConditioning",
        "LatentFlip",
        "LatentRotate",
        "LoadImage",
        "LoadImageMask",
        "LoadImageOutput",
        "LoadLatent",
        "PreviewImage",
        "SaveImage",
        "SaveLatent",
        "SetLatentNoiseMask",
        "StyleModelLoader",
        "UNETLoader",
        "VAEDecode",
        "VAEEncode",
        "VAELoader",
        "unCLIPCheckpointLoader",
    }
)
"""The other 33 node classes of nodes.py: no number input with a limit (nothing to check)."""


SAMPLERS = (
    "euler",
    "euler_cfg_pp",
    "euler_ancestral",
    "euler_ancestral_cfg_pp",
    "heun",
    "heunpp2",
    "dpm_2",
    "dpm_2_ancestral",
    "lms",
    "dpm_fast",
    "dpm_adaptive",
    "dpmpp_2s_ancestral",
    "dpmpp_2s_ancestral_cfg_pp",
    "dpmpp_sde",
    "dpmpp_sde_gpu",
    "dpmpp_2m",
    "dpmpp_2m_cfg_pp",
    "dpmpp_2m_sde",
    "dpmpp_2m_sde_gpu",
    "dpmpp_2m_sde_heun",
    "dpmpp_2m_sde_heun_gpu",
    "dpmpp_3m_sde",
    "dpmpp_3m_sde_gpu",
    "ddpm",
    "lcm",
    "ipndm",
    "ipndm_v",
    "deis",
    "res_multistep",
    "res_multistep_cfg_pp",
    "res_multistep_ancestral",
    "res_multistep_ancestral_cfg_pp",
    "gradient_estimation",
    "gradient_estimation_cfg_pp",
    "er_sde",
    "seeds_2",
    "seeds_3",
    "sa_solver",
    "sa_solver_pece",
    "ddim",
    "uni_pc",
    "uni_pc_bh2",
)
"""`comfy/samplers.py` `SAMPLER_NAMES` (KSampler's `sampler_name`)."""
SCHEDULERS = (
    "simple",
    "sgm_uniform",
    "karras",
    "exponential",
    "ddim_uniform",
    "beta",
    "normal",
    "linear_quadratic",
    "kl_optimal",
)
"""`comfy/samplers.py` `SCHEDULER_NAMES` (KSampler's `scheduler`)."""
_LATENT_UPSCALE = ("nearest-exact", "bilinear", "area", "bicubic", "bislerp")
_IMAGE_UPSCALE = ("nearest-exact", "bilinear", "area", "bicubic", "lanczos")
_CROP = ("disabled", "center")
_SAMPLING = {"sampler_name": SAMPLERS, "scheduler": SCHEDULERS}

NODE_CHOICES: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    # nodes.py (ComfyUI's `validate_inputs` answers `value_not_in_list`, a 400)
    "CLIPLoader": {"device": ("default", "cpu")},
    "CLIPVisionEncode": {"crop": ("center", "none")},
    "ConditioningSetMask": {"set_cond_area": ("default", "mask bounds")},
    "DualCLIPLoader": {"device": ("default", "cpu")},
    "ImageScale": {"upscale_method": _IMAGE_UPSCALE, "crop": _CROP},
    "ImageScaleBy": {"upscale_method": _IMAGE_UPSCALE},
    "KSampler": _SAMPLING,
    "KSamplerAdvanced": {
        **_SAMPLING,
        "add_noise": ("enable", "disable"),
        "return_with_leftover_noise": ("disable", "enable"),
    },
    "LatentFlip": {"flip_method": ("x-axis: vertically", "y-axis: horizontally")},
    "LatentRotate": {"rotation": ("none", "90 degrees", "180 degrees", "270 degrees")},
    "LatentUpscale": {"upscale_method": _LATENT_UPSCALE, "crop": _CROP},
    "LatentUpscaleBy": {"upscale_method": _LATENT_UPSCALE},
    "LoadImageMask": {"channel": ("alpha", "red", "green", "blue")},
    "StyleModelApply": {"strength_type": ("multiply", "attn_bias")},
    "UNETLoader": {"weight_dtype": ("default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2")},
    # comfy_extras/nodes_post_processing.py (`io.Combo`: ComfyUI checks these only when
    # the node runs, after its 200; the runner checks them before, all the same)
    "ImageBlend": {
        "blend_mode": ("normal", "multiply", "screen", "overlay", "soft_light", "difference"),
    },
    "ImageQuantize": {
        "dither": ("none", "floyd-steinberg", "bayer-2", "bayer-4", "bayer-8", "bayer-16"),
    },
    "ImageScaleToTotalPixels": {"upscale_method": _IMAGE_UPSCALE},
}
"""Node class -> input -> its fixed choices (a COMBO of a list that no file decides; the
lists of files, such as `ckpt_name`, are the server's and not checked here). CLIPLoader's
and DualCLIPLoader's `type` lists are left out: they grow with each release."""


def choices_of(class_type: str, input_name: str) -> tuple[str, ...] | None:
    """ComfyUI's fixed choices for `class_type`'s input `input_name` (None: not known)."""
    return NODE_CHOICES.get(class_type, {}).get(input_name)


def limit_of(class_type: str, input_name: str) -> Limit | None:
    """ComfyUI's limit on `class_type`'s input `input_name` (None: it has none known)."""
    return NODE_LIMITS.get(class_type, {}).get(input_name)


def known(class_type: str) -> bool:
    """Whether the runner knows `class_type`'s number limits (or that it has none)."""
    return class_type in NODE_LIMITS or class_type in NO_LIMITS
