"""Tiny random-weight diffusers models of many kinds, a sibling of `family_models.py`.

`FAMILIES`: name -> factory() returning (model, args, kwargs, loss_of), the contract of
`family_models.FAMILIES`: the model in training mode, with a small nonzero dropout where
its config has one. Diffusers models compute no loss, so each is wrapped in a module
whose forward takes the model's inputs and a target and returns the loss its training
loop would (`Denoise`: mean squared error of the predicted noise; autoencoders: the
reconstruction error plus the KL term of the latent distribution or the codebook's
commitment loss; side networks such as ControlNet: the squares of the features they
give a U-Net), and loss_of is the identity. Timesteps are fixed tensors among the
inputs. Models are a few thousand to a few tens of thousands of parameters (the
spatio-temporal U-Net, the 1D U-Net, the temporal-decoder VAE and Z-Image are larger:
widths fixed by their code), on batches of 2 with 8x8 or 16x16 latents or images,
2 to 5 frames and 6 text tokens. Where zero-initialized parameters (ControlNet's zero
convolutions, temporal layers that start as identities, zero gates) would make most
gradients zero, they get small random values (`unzero`).

Left out, at diffusers 0.42.1: CosmosTransformer3DModel (its forward needs torchvision,
not installed), ConsistencyDecoderVAE (its decoder is a sampling loop, with no training
loss), OmniGenTransformer2DModel (inputs that interleave text tokens and image latents
by per-sample position tables), and the many further transformers that recombine
blocks already here.
"""
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch import nn

import diffusers as D

B = 2
#: Timesteps of DDPM-style models (integers in 0..999) and of flow-matching ones (in 0..1).
STEPS, FLOW_STEPS = (10, 500), (0.2, 0.7)


def quiet():
    from diffusers.utils import logging
    logging.set_verbosity_error()


def randn(*shape):
    return torch.randn(B, *shape)


def text(seq=6, dim=16):
    """Text-encoder states: `seq` tokens of width `dim`."""
    return randn(seq, dim)


def steps():
    return torch.tensor(STEPS)


def flow_steps():
    return torch.tensor(FLOW_STEPS)


def classes():
    return torch.tensor([1, 3])


def identity(out):
    return out


def but(config, *dropped, **changed):
    """`config` without the keys `dropped`, with `changed` on top."""
    return {**{k: v for k, v in config.items() if k not in dropped}, **changed}


def unzero(model, std=0.1):
    """`model` with small random values in its zero-initialized parameters."""
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(std=std)
    return model


# Losses ------------------------------------------------------------------------------

class Denoise(nn.Module):
    """A denoiser's prediction against `target` by mean squared error: a diffusion training step.
    The prediction is the model's first output (a list of per-image ones, from Z-Image, stacked)."""

    def __init__(self, model, **options):
        super().__init__()
        self.model, self.options = model, options

    def forward(self, target, **inputs):
        out = self.model(**inputs, **self.options)
        prediction = out[0] if isinstance(out, tuple) else out
        return F.mse_loss(torch.stack(prediction) if isinstance(prediction, list) else prediction, target)


class GaussianVAE(nn.Module):
    """Reconstruction error of a posterior sample, plus a small weight of the posterior's KL term."""

    def __init__(self, vae, kl_weight=1e-3):
        super().__init__()
        self.vae, self.kl_weight = vae, kl_weight

    def forward(self, sample, **decode_kwargs):
        posterior = self.vae.encode(sample).latent_dist
        reconstruction = self.vae.decode(posterior.sample(), **decode_kwargs).sample
        return F.mse_loss(reconstruction, sample) + self.kl_weight * posterior.kl().mean()


class Quantized(nn.Module):
    """A VQ autoencoder's reconstruction error plus its codebook commitment loss."""

    def __init__(self, vq):
        super().__init__()
        self.vq = vq

    def forward(self, sample):
        reconstruction, commit_loss = self.vq(sample, return_dict=False)
        return F.mse_loss(reconstruction, sample) + commit_loss.mean()


class Reconstruct(nn.Module):
    """A deterministic autoencoder's reconstruction error, through its latents."""

    def __init__(self, ae):
        super().__init__()
        self.ae = ae

    def forward(self, sample):
        latents = self.ae.encode(sample, return_dict=False)[0]
        return F.mse_loss(self.ae.decode(latents, return_dict=False)[0], sample)


class Residuals(nn.Module):
    """Every feature a side network (ControlNet, T2I-Adapter) gives a base model, summed into a loss."""

    def __init__(self, model, **options):
        super().__init__()
        self.model, self.options = model, options

    def forward(self, **inputs):
        features = pytree.tree_leaves(self.model(**inputs, **self.options))
        return sum(f.square().mean() for f in features)


class MaskedTokens(nn.Module):
    """A masked-token image model's logits against the image tokens, by cross entropy (aMUSEd)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, labels, **inputs):
        return F.cross_entropy(self.model(**inputs), labels)


# Factories ---------------------------------------------------------------------------

def denoise(model_cls, target_shape, inputs, unzeroed=False, **config):
    """`model_cls(**config)` predicting a target of `target_shape` from `inputs()`."""
    def f():
        model = model_cls(**config)
        model = Denoise(unzero(model) if unzeroed else model, return_dict=False).train()
        return model, (), dict(target=randn(*target_shape), **inputs()), identity
    return f


def side_network(model_cls, inputs, **config):
    """The features `model_cls(**config)` gives its base model for `inputs()`, summed into a loss."""
    def f():
        return Residuals(unzero(model_cls(**config)), return_dict=False).train(), (), inputs(), identity
    return f


def gaussian_vae(model_cls, shape, **config):
    """`model_cls(**config)` reconstructing a sample of `shape` (see `GaussianVAE`)."""
    def f():
        return GaussianVAE(model_cls(**config)).train(), (), dict(sample=randn(*shape)), identity
    return f


# U-Nets ------------------------------------------------------------------------------

UNET2D = dict(sample_size=16, in_channels=3, out_channels=3, block_out_channels=(8, 16), layers_per_block=1,
              down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
              norm_num_groups=4, attention_head_dim=8, dropout=0.1)

COND2D = dict(sample_size=8, in_channels=4, out_channels=4, block_out_channels=(8, 16), layers_per_block=1,
              down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
              up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16, attention_head_dim=4,
              norm_num_groups=4, dropout=0.1)


def unet2d_inputs():
    return dict(sample=randn(3, 16, 16), timestep=steps())


def cond2d_inputs():
    return dict(sample=randn(4, 8, 8), timestep=steps(), encoder_hidden_states=text())


def sdxl_inputs():
    return {**cond2d_inputs(), "added_cond_kwargs": dict(text_embeds=randn(16), time_ids=randn(6))}


def video_inputs():
    """Latents of 3 frames, (batch, channels, frames, height, width)."""
    return dict(sample=randn(4, 3, 8, 8), timestep=steps(), encoder_hidden_states=text())


def motion_inputs():
    # AnimateDiff's pipeline gives the U-Net one copy of the prompt per frame
    return {**video_inputs(), "encoder_hidden_states": torch.randn(B * 3, 6, 16)}


def i2vgen_inputs():
    return {**video_inputs(), "fps": torch.tensor([8, 8]), "image_latents": randn(4, 3, 8, 8),
            "image_embeddings": randn(16)}


def svd_inputs():
    """Latents of 3 frames, (batch, frames, channels, height, width), and one image embedding."""
    return dict(sample=randn(3, 4, 8, 8), timestep=steps(), encoder_hidden_states=text(1, 32),
                added_time_ids=randn(3))


def kandinsky3_inputs():
    return {**cond2d_inputs(), "encoder_attention_mask": torch.ones(B, 6)}


def cascade_inputs():
    return dict(sample=randn(4, 8, 8), timestep_ratio=flow_steps(), clip_text_pooled=randn(1, 8))


def controlnet_inputs():
    return {**cond2d_inputs(), "controlnet_cond": randn(3, 16, 16)}


def controlnet_xs_inputs():
    return {**cond2d_inputs(), "encoder_hidden_states": text(4, 8), "controlnet_cond": randn(3, 16, 16)}


def t2i_adapter(adapter_type):
    def f():
        model = Residuals(D.T2IAdapter(in_channels=3, channels=[8, 16], num_res_blocks=1, downscale_factor=2,
                                       adapter_type=adapter_type)).train()
        return model, (), dict(x=randn(3, 16, 16)), identity
    return f


# Autoencoders ------------------------------------------------------------------------

KL2D = dict(in_channels=3, out_channels=3, block_out_channels=(8, 16), layers_per_block=1, latent_channels=4,
            down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
            norm_num_groups=4, sample_size=16)


def asymmetric_kl():
    """The inpainting decoder, given the image and a random mask."""
    vae = D.AsymmetricAutoencoderKL(in_channels=3, out_channels=3, down_block_out_channels=(8, 16),
                                    up_block_out_channels=(8, 16), layers_per_down_block=1, layers_per_up_block=1,
                                    down_block_types=("DownEncoderBlock2D",) * 2,
                                    up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4, norm_num_groups=4,
                                    sample_size=16)
    image = randn(3, 16, 16)
    mask = (torch.rand(B, 1, 16, 16) > 0.5).float()
    return GaussianVAE(vae).train(), (), dict(sample=image, image=image, mask=mask), identity


def temporal_decoder_vae():
    """Stable Video Diffusion's VAE: frames batched as images, decoded together."""
    vae = D.AutoencoderKLTemporalDecoder(block_out_channels=(32, 32), down_block_types=("DownEncoderBlock2D",) * 2,
                                         layers_per_block=1, latent_channels=4, sample_size=16)
    return GaussianVAE(vae).train(), (), dict(sample=torch.randn(2 * B, 3, 16, 16), num_frames=2), identity


def autoencoder_tiny():
    ae = D.AutoencoderTiny(encoder_block_out_channels=(8, 8), decoder_block_out_channels=(8, 8),
                           num_encoder_blocks=(1, 1), num_decoder_blocks=(1, 1), latent_channels=4)
    return Reconstruct(ae).train(), (), dict(sample=randn(3, 16, 16)), identity


def autoencoder_dc():
    ae = D.AutoencoderDC(in_channels=3, latent_channels=4, attention_head_dim=4,
                         encoder_block_types=("ResBlock", "EfficientViTBlock"),
                         decoder_block_types=("ResBlock", "EfficientViTBlock"),
                         encoder_block_out_channels=(8, 16), decoder_block_out_channels=(8, 16),
                         encoder_layers_per_block=(1, 1), decoder_layers_per_block=(1, 1),
                         encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)))
    return Reconstruct(ae).train(), (), dict(sample=randn(3, 16, 16)), identity


def vq_model():
    vq = D.VQModel(**but(KL2D, latent_channels=3), num_vq_embeddings=16)
    return Quantized(vq).train(), (), dict(sample=randn(3, 16, 16)), identity


# Transformers ------------------------------------------------------------------------

def patch_inputs():
    return dict(hidden_states=randn(4, 8, 8), timestep=steps())


def pixart_inputs():
    return {**patch_inputs(), "encoder_hidden_states": text(),
            "added_cond_kwargs": dict(resolution=None, aspect_ratio=None)}


def sd3_inputs():
    return dict(hidden_states=randn(4, 8, 8), encoder_hidden_states=text(), pooled_projections=randn(8),
                timestep=flow_steps())


def flux_ids(axes=3):
    """Positions of a 4x4 grid of latent tokens, (row, column) on axes 1 and 2."""
    ids = torch.zeros(16, axes)
    ids[:, 1], ids[:, 2] = torch.arange(16) // 4, torch.arange(16) % 4
    return ids


def flux_inputs():
    """A 4x4 grid of packed latent tokens of 16 channels."""
    return dict(hidden_states=randn(16, 16), encoder_hidden_states=text(), pooled_projections=randn(8),
                timestep=flow_steps(), img_ids=flux_ids(), txt_ids=torch.zeros(6, 3), guidance=torch.full((B,), 3.5))


def chroma_inputs():
    return but(flux_inputs(), "pooled_projections", "guidance")


def flux2_inputs():
    return dict(hidden_states=randn(16, 16), encoder_hidden_states=text(), timestep=flow_steps(),
                img_ids=flux_ids(4), txt_ids=torch.zeros(6, 4), guidance=torch.full((B,), 3.5))


def hunyuan_dit_inputs():
    from diffusers.models.embeddings import get_2d_rotary_pos_embed
    return dict(hidden_states=randn(4, 8, 8), timestep=steps().float(), encoder_hidden_states=text(4, 8),
                text_embedding_mask=torch.ones(B, 4), encoder_hidden_states_t5=text(4, 8),
                text_embedding_mask_t5=torch.ones(B, 4),
                image_meta_size=torch.tensor([[64.0, 64.0, 8.0, 8.0, 0.0, 0.0]] * B),
                style=torch.zeros(B, dtype=torch.int64),
                image_rotary_emb=get_2d_rotary_pos_embed(8, ((0, 0), (4, 4)), (4, 4)))


def lumina_next_inputs():
    from diffusers.models.embeddings import get_2d_rotary_pos_embed_lumina
    return dict(hidden_states=randn(4, 8, 8), timestep=flow_steps(), encoder_hidden_states=text(),
                encoder_mask=torch.ones(B, 6), image_rotary_emb=get_2d_rotary_pos_embed_lumina(8, 8, 8),
                cross_attention_kwargs={})


def masked_text_inputs(*latent_shape):
    def inputs():
        return dict(hidden_states=randn(*latent_shape), encoder_hidden_states=text(), timestep=steps(),
                    encoder_attention_mask=torch.ones(B, 6, dtype=torch.bool))
    return inputs


def text_inputs(*latent_shape, text_seq=6):
    def inputs():
        return dict(hidden_states=randn(*latent_shape), encoder_hidden_states=text(text_seq), timestep=steps())
    return inputs


def ltx_inputs():
    """2 frames of 4x4 packed latent tokens."""
    return dict(hidden_states=randn(2 * 4 * 4, 4), encoder_hidden_states=text(), timestep=steps(),
                encoder_attention_mask=torch.ones(B, 6), num_frames=2, height=4, width=4)


def wan_i2v_inputs():
    # Wan's attention tells the image tokens from the text by assuming 512 text tokens
    return {**text_inputs(4, 2, 8, 8, text_seq=512)(), "encoder_hidden_states_image": text(4)}


def qwenimage_inputs():
    return dict(hidden_states=randn(16, 16), encoder_hidden_states=text(), encoder_hidden_states_mask=torch.ones(B, 6),
                timestep=flow_steps(), img_shapes=[(1, 4, 4)] * B)


def hunyuan_video_inputs():
    return dict(hidden_states=randn(4, 2, 4, 4), timestep=steps(), encoder_hidden_states=text(),
                encoder_attention_mask=torch.ones(B, 6), pooled_projections=randn(8), guidance=torch.full((B,), 3.5))


def cogview_inputs():
    sizes = torch.tensor([[64.0, 64.0]] * B)
    return dict(hidden_states=randn(4, 8, 8), encoder_hidden_states=text(6, 8), timestep=steps(),
                original_size=sizes, target_size=sizes, crop_coords=torch.zeros(B, 2))


def stable_audio_inputs():
    """16 latent steps of 4 channels; the rotary embedding covers them and the global token."""
    from diffusers.models.embeddings import get_1d_rotary_pos_embed
    return dict(hidden_states=randn(4, 16), timestep=steps(), encoder_hidden_states=text(),
                global_hidden_states=randn(1, 16),
                rotary_embedding=get_1d_rotary_pos_embed(4, 17, use_real=True, repeat_interleave_real=False))


def hidream_inputs():
    """Llama-3 states of two layers, (layers, batch, tokens, width), beside T5's."""
    return dict(hidden_states=randn(4, 8, 8), timesteps=steps(), encoder_hidden_states_t5=text(6, 8),
                encoder_hidden_states_llama3=torch.randn(2, B, 6, 4), pooled_embeds=randn(8))


def z_image_inputs():
    """A list of images, (channels, frames, height, width) each, and a list of their captions."""
    return dict(x=[torch.randn(4, 1, 8, 8) for _ in range(B)], cap_feats=[torch.randn(6, 16) for _ in range(B)],
                t=flow_steps())


def prior_inputs():
    return dict(hidden_states=randn(8), timestep=steps(), proj_embedding=randn(8),
                encoder_hidden_states=text(7, 8), attention_mask=torch.ones(B, 7, dtype=torch.bool))


def uvit2d():
    """aMUSEd's U-ViT: half the image tokens replaced by the mask token (id 32) at random."""
    model = MaskedTokens(D.UVit2DModel(hidden_size=32, use_bias=False, hidden_dropout=0.1, cond_embed_dim=16,
                                       micro_cond_encode_dim=2, micro_cond_embed_dim=10, encoder_hidden_size=16,
                                       vocab_size=33, codebook_size=32, in_channels=16, block_out_channels=16,
                                       num_res_blocks=1, downsample=True, upsample=True, block_num_heads=1,
                                       num_hidden_layers=1, num_attention_heads=1, attention_dropout=0.1,
                                       intermediate_size=32, sample_size=8)).train()
    labels = torch.randint(0, 32, (B, 8, 8))
    masked = torch.where(torch.rand(B, 8, 8) < 0.5, 32, labels)
    return model, (), dict(labels=labels, input_ids=masked, encoder_hidden_states=text(),
                           pooled_text_emb=randn(16), micro_conds=randn(5)), identity


def t5_film():
    """Spectrogram diffusion's decoder: 16 frames of 8 mel bins, cross-attending to one encoding."""
    model = Denoise(D.T5FilmDecoder(input_dims=8, targets_length=16, d_model=16, num_layers=2, num_heads=2, d_kv=8,
                                    d_ff=32, dropout_rate=0.1)).train()
    encodings = [(text(), torch.ones(B, 6, dtype=torch.bool))]
    return model, (), dict(target=randn(16, 8), encodings_and_masks=encodings, decoder_input_tokens=randn(16, 8),
                           decoder_noise_time=flow_steps()), identity


SD3 = dict(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
           joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=8, out_channels=4,
           pos_embed_max_size=8)

FLUX = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8,
            num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=8, guidance_embeds=True,
            axes_dims_rope=(2, 2, 4))

WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
           text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2, rope_max_seq_len=32)

COGVIEW = dict(patch_size=2, in_channels=4, num_layers=2, attention_head_dim=4, num_attention_heads=2, out_channels=4,
               text_embed_dim=8, time_embed_dim=8, condition_dim=2, pos_embed_max_size=8, sample_size=8)


FAMILIES = {
    # U-Nets
    "unet2d": denoise(D.UNet2DModel, (3, 16, 16), unet2d_inputs, **UNET2D),
    "unet2d-class": denoise(D.UNet2DModel, (3, 16, 16), lambda: {**unet2d_inputs(), "class_labels": classes()},
                            **UNET2D, num_class_embeds=4, resnet_time_scale_shift="scale_shift"),
    "unet1d": denoise(D.UNet1DModel, (2, 32), lambda: dict(sample=randn(2, 32), timestep=steps()),
                      sample_size=32, in_channels=2, out_channels=2, block_out_channels=(8, 32, 32),
                      norm_num_groups=4, extra_in_channels=16),
    "unet1d-rl": denoise(D.UNet1DModel, (4, 16), lambda: dict(sample=randn(4, 16), timestep=steps()),
                         sample_size=16, in_channels=4, out_channels=4, block_out_channels=(8, 8, 16, 16),
                         time_embedding_type="positional", use_timestep_embedding=True, flip_sin_to_cos=False,
                         freq_shift=1.0, out_block_type="OutConv1DBlock", mid_block_type="MidResTemporalBlock1D",
                         down_block_types=("DownResnetBlock1D",) * 4, up_block_types=("UpResnetBlock1D",) * 3,
                         act_fn="swish", norm_num_groups=4, layers_per_block=1),
    "unet2d-cond": denoise(D.UNet2DConditionModel, (4, 8, 8), cond2d_inputs, **COND2D),
    "unet2d-cond-sdxl": denoise(D.UNet2DConditionModel, (4, 8, 8), sdxl_inputs,
                                **COND2D, use_linear_projection=True, transformer_layers_per_block=(1, 2),
                                addition_embed_type="text_time", addition_time_embed_dim=4,
                                projection_class_embeddings_input_dim=16 + 6 * 4),
    "unet3d-cond": denoise(D.UNet3DConditionModel, (4, 3, 8, 8), video_inputs, unzeroed=True,
                           **but(COND2D, "dropout", down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
                                 up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"))),
    "unet-spatiotemporal": denoise(D.UNetSpatioTemporalConditionModel, (3, 4, 8, 8), svd_inputs,
                                   sample_size=8, in_channels=4, out_channels=4, block_out_channels=(32, 32),
                                   down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
                                   up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
                                   layers_per_block=1, cross_attention_dim=32, num_attention_heads=(2, 2),
                                   addition_time_embed_dim=4, projection_class_embeddings_input_dim=12,
                                   num_frames=3),
    "unet-motion": denoise(D.UNetMotionModel, (4, 3, 8, 8), motion_inputs, unzeroed=True,
                           **but(COND2D, "dropout", "attention_head_dim",
                                 down_block_types=("CrossAttnDownBlockMotion", "DownBlockMotion"),
                                 up_block_types=("UpBlockMotion", "CrossAttnUpBlockMotion"),
                                 num_attention_heads=2, motion_num_attention_heads=2, motion_max_seq_length=8)),
    "i2vgen-xl": denoise(D.I2VGenXLUNet, (4, 3, 8, 8), i2vgen_inputs, unzeroed=True,
                         **but(COND2D, "dropout", down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
                               up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"), attention_head_dim=2)),
    # layers_per_block=1 builds an up block's self-attention for the wrong width
    "kandinsky3": denoise(D.Kandinsky3UNet, (4, 8, 8), kandinsky3_inputs, unzeroed=True,
                          in_channels=4, time_embedding_dim=16, groups=4, attention_head_dim=4, layers_per_block=2,
                          block_out_channels=(8, 16), cross_attention_dim=16, encoder_hid_dim=16),
    "stable-cascade": denoise(D.StableCascadeUNet, (4, 8, 8), cascade_inputs,
                              in_channels=4, out_channels=4, timestep_ratio_embedding_dim=8, conditioning_dim=16,
                              block_out_channels=(16, 16), num_attention_heads=(2, 2),
                              down_num_layers_per_block=(1, 1), up_num_layers_per_block=(1, 1),
                              clip_text_pooled_in_channels=8, clip_seq=2, dropout=(0.1, 0.1),
                              timestep_conditioning_type=("sca",), switch_level=(False,)),
    # ControlNets and adapters
    "controlnet": side_network(D.ControlNetModel, controlnet_inputs,
                               **but(COND2D, "sample_size", "out_channels", "up_block_types", "dropout",
                                     conditioning_embedding_out_channels=(4, 8))),
    "controlnet-xs": denoise(D.UNetControlNetXSModel, (4, 8, 8), controlnet_xs_inputs, unzeroed=True,
                             sample_size=8, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                             up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), block_out_channels=(8, 16),
                             norm_num_groups=4, cross_attention_dim=8, num_attention_heads=2, upcast_attention=False,
                             ctrl_block_out_channels=(2, 4), ctrl_num_attention_heads=2, ctrl_max_norm_num_groups=2,
                             ctrl_conditioning_embedding_out_channels=(2, 2)),
    "sd3-controlnet": side_network(D.SD3ControlNetModel, lambda: {**sd3_inputs(), "controlnet_cond": randn(4, 8, 8)},
                                   **SD3),
    "flux-controlnet": side_network(D.FluxControlNetModel,
                                    lambda: {**flux_inputs(), "controlnet_cond": randn(16, 16)}, **FLUX),
    "t2i-adapter": t2i_adapter("full_adapter"),
    "t2i-adapter-light": t2i_adapter("light_adapter"),
    # Autoencoders
    "autoencoder-kl": gaussian_vae(D.AutoencoderKL, (3, 16, 16), **KL2D),
    "autoencoder-kl-asymmetric": asymmetric_kl,
    "autoencoder-kl-temporal-decoder": temporal_decoder_vae,
    "autoencoder-tiny": autoencoder_tiny,
    "autoencoder-dc": autoencoder_dc,
    "vq": vq_model,
    "autoencoder-kl-wan": gaussian_vae(D.AutoencoderKLWan, (3, 5, 16, 16), base_dim=8, z_dim=4, dim_mult=[1, 2],
                                       num_res_blocks=1, temperal_downsample=[True], dropout=0.1,
                                       latents_mean=[0.0] * 4, latents_std=[1.0] * 4),
    "autoencoder-kl-cogvideox": gaussian_vae(D.AutoencoderKLCogVideoX, (3, 5, 16, 16),
                                             down_block_types=("CogVideoXDownBlock3D",) * 2,
                                             up_block_types=("CogVideoXUpBlock3D",) * 2, block_out_channels=(8, 16),
                                             latent_channels=4, layers_per_block=1, norm_num_groups=4,
                                             temporal_compression_ratio=2, sample_height=16, sample_width=16),
    "autoencoder-kl-ltx-video": gaussian_vae(D.AutoencoderKLLTXVideo, (3, 5, 16, 16),
                                             latent_channels=4, block_out_channels=(8, 8, 8, 8),
                                             decoder_block_out_channels=(8, 8, 8, 8),
                                             layers_per_block=(1, 1, 1, 1, 1),
                                             decoder_layers_per_block=(1, 1, 1, 1, 1),
                                             spatio_temporal_scaling=(True, True, False, False),
                                             decoder_spatio_temporal_scaling=(True, True, False, False),
                                             decoder_inject_noise=(True, True, True, False, False),
                                             upsample_residual=(True, True, False, False),
                                             upsample_factor=(1, 1, 1, 1), patch_size=1, patch_size_t=1),
    "autoencoder-kl-hunyuan-video": gaussian_vae(D.AutoencoderKLHunyuanVideo, (3, 5, 16, 16),
                                                 latent_channels=4, block_out_channels=(8, 8, 16),
                                                 down_block_types=("HunyuanVideoDownBlock3D",) * 3,
                                                 up_block_types=("HunyuanVideoUpBlock3D",) * 3,
                                                 layers_per_block=1, norm_num_groups=4, spatial_compression_ratio=4,
                                                 temporal_compression_ratio=4),
    "autoencoder-oobleck": gaussian_vae(D.AutoencoderOobleck, (2, 64), encoder_hidden_size=8,
                                        downsampling_ratios=[2, 4], channel_multiples=[1, 2], decoder_channels=4,
                                        decoder_input_channels=4, audio_channels=2),
    # Transformers
    "transformer2d-patch": denoise(D.Transformer2DModel, (4, 8, 8), pixart_inputs,
                                   num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
                                   num_layers=2, dropout=0.1, sample_size=8, patch_size=2,
                                   norm_type="ada_norm_single", cross_attention_dim=16, caption_channels=16,
                                   norm_elementwise_affine=False, norm_eps=1e-6, activation_fn="gelu-approximate",
                                   attention_bias=True, num_embeds_ada_norm=1000),
    "transformer2d-continuous": denoise(D.Transformer2DModel, (8, 8, 8),
                                        lambda: dict(hidden_states=randn(8, 8, 8), encoder_hidden_states=text()),
                                        num_attention_heads=2, attention_head_dim=4, in_channels=8, num_layers=1,
                                        dropout=0.1, norm_num_groups=4, cross_attention_dim=16,
                                        use_linear_projection=True),
    "dit": denoise(D.DiTTransformer2DModel, (8, 8, 8), lambda: {**patch_inputs(), "class_labels": classes()},
                   num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=2,
                   dropout=0.1, sample_size=8, patch_size=2, num_embeds_ada_norm=4),
    "pixart": denoise(D.PixArtTransformer2DModel, (8, 8, 8), pixart_inputs,
                      num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=2,
                      dropout=0.1, cross_attention_dim=16, sample_size=8, patch_size=2, caption_channels=16),
    "sd3": denoise(D.SD3Transformer2DModel, (4, 8, 8), sd3_inputs, **SD3),
    "sd35": denoise(D.SD3Transformer2DModel, (4, 8, 8), sd3_inputs, **SD3, dual_attention_layers=(0,),
                    qk_norm="rms_norm"),
    "flux": denoise(D.FluxTransformer2DModel, (16, 16), flux_inputs, **FLUX),
    "flux2": denoise(D.Flux2Transformer2DModel, (16, 16), flux2_inputs,
                     **but(FLUX, "pooled_projection_dim", timestep_guidance_channels=8, axes_dims_rope=(2, 2, 2, 2))),
    "chroma": denoise(D.ChromaTransformer2DModel, (16, 16), chroma_inputs,
                      **but(FLUX, "pooled_projection_dim", "guidance_embeds", approximator_num_channels=8,
                            approximator_hidden_dim=16, approximator_layers=1)),
    "auraflow": denoise(D.AuraFlowTransformer2DModel, (4, 8, 8),
                        lambda: but(sd3_inputs(), "pooled_projections"),
                        sample_size=8, patch_size=2, in_channels=4, num_mmdit_layers=1, num_single_dit_layers=1,
                        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16,
                        caption_projection_dim=16, out_channels=4, pos_embed_max_size=64),
    "hunyuan-dit": denoise(D.HunyuanDiT2DModel, (8, 8, 8), hunyuan_dit_inputs,
                           sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
                           num_attention_heads=2, cross_attention_dim=8, cross_attention_dim_t5=8,
                           pooled_projection_dim=4, hidden_size=16, text_len=4, text_len_t5=4, mlp_ratio=2.0),
    "lumina-next": denoise(D.LuminaNextDiT2DModel, (4, 8, 8), lumina_next_inputs, unzeroed=True,
                           sample_size=8, patch_size=2, in_channels=4, hidden_size=16, num_layers=2,
                           num_attention_heads=2, num_kv_heads=1, multiple_of=16, learn_sigma=False,
                           cross_attention_dim=16),
    "lumina2": denoise(D.Lumina2Transformer2DModel, (4, 8, 8), masked_text_inputs(4, 8, 8),
                       sample_size=8, patch_size=2, in_channels=4, hidden_size=24, num_layers=2, num_refiner_layers=1,
                       num_attention_heads=3, num_kv_heads=1, multiple_of=16, axes_dim_rope=(4, 2, 2),
                       axes_lens=(32, 32, 32), cap_feat_dim=16),
    "sana": denoise(D.SanaTransformer2DModel, (4, 8, 8), text_inputs(4, 8, 8),
                    in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
                    num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16,
                    caption_channels=16, sample_size=8, patch_size=1, dropout=0.1),
    "qwenimage": denoise(D.QwenImageTransformer2DModel, (16, 16), qwenimage_inputs,
                         patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
                         num_attention_heads=2, joint_attention_dim=16, axes_dims_rope=(8, 4, 4)),
    # a timestep MLP 1024 wide, fixed by its code, holds most of the parameters
    "z-image": denoise(D.ZImageTransformer2DModel, (4, 1, 8, 8), z_image_inputs,
                       all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=16, n_layers=1,
                       n_refiner_layers=1, n_heads=2, n_kv_heads=2, cap_feat_dim=16, axes_dims=[4, 2, 2],
                       axes_lens=[64, 16, 16]),
    "cogview3plus": denoise(D.CogView3PlusTransformer2DModel, (4, 8, 8), cogview_inputs, **COGVIEW),
    "cogview4": denoise(D.CogView4Transformer2DModel, (4, 8, 8), cogview_inputs, **COGVIEW, rope_axes_dim=(4, 4)),
    # in training, HiDream predicts in patch layout: (channels, tokens, pixels of a patch)
    "hidream": denoise(D.HiDreamImageTransformer2DModel, (4, 16, 4), hidream_inputs,
                       patch_size=2, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1,
                       attention_head_dim=8, num_attention_heads=2, caption_channels=[8, 4], text_emb_dim=8,
                       num_routed_experts=2, num_activated_experts=1, axes_dims_rope=(4, 2, 2), max_resolution=(8, 8),
                       llama_layers=(0, 1)),
    "cogvideox": denoise(D.CogVideoXTransformer3DModel, (2, 4, 8, 8), text_inputs(2, 4, 8, 8, text_seq=4),
                         num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
                         time_embed_dim=8, text_embed_dim=16, num_layers=2, dropout=0.1, sample_width=8,
                         sample_height=8, sample_frames=5, patch_size=2, max_text_seq_length=4),
    "ltx-video": denoise(D.LTXVideoTransformer3DModel, (32, 4), ltx_inputs,
                         in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8,
                         cross_attention_dim=16, num_layers=2, caption_channels=16),
    "wan": denoise(D.WanTransformer3DModel, (4, 2, 8, 8), text_inputs(4, 2, 8, 8), **WAN),
    "wan-i2v": denoise(D.WanTransformer3DModel, (4, 2, 8, 8), wan_i2v_inputs, **WAN, image_dim=16,
                       added_kv_proj_dim=24),
    "hunyuan-video": denoise(D.HunyuanVideoTransformer3DModel, (4, 2, 4, 4), hunyuan_video_inputs,
                             in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10,
                             num_layers=1, num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1,
                             text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4)),
    "mochi": denoise(D.MochiTransformer3DModel, (4, 2, 8, 8), masked_text_inputs(4, 2, 8, 8),
                     patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=2,
                     pooled_projection_dim=16, in_channels=4, text_embed_dim=16, time_embed_dim=4,
                     max_sequence_length=16),
    "latte": denoise(D.LatteTransformer3DModel, (8, 2, 8, 8), text_inputs(4, 2, 8, 8),
                     num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=1,
                     dropout=0.1, cross_attention_dim=16, sample_size=8, patch_size=2, norm_type="ada_norm_single",
                     caption_channels=16, video_length=2, activation_fn="gelu-approximate",
                     norm_elementwise_affine=False, norm_eps=1e-6, num_embeds_ada_norm=1000, attention_bias=True),
    "allegro": denoise(D.AllegroTransformer3DModel, (4, 2, 8, 8), text_inputs(4, 2, 8, 8),
                       patch_size=2, patch_size_t=1, num_attention_heads=2, attention_head_dim=8, in_channels=4,
                       out_channels=4, num_layers=1, dropout=0.1, cross_attention_dim=16, sample_height=8,
                       sample_width=8, sample_frames=2, caption_channels=16),
    "stable-audio": denoise(D.StableAudioDiTModel, (4, 16), stable_audio_inputs,
                            sample_size=16, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
                            num_key_value_attention_heads=1, out_channels=4, cross_attention_dim=16, time_proj_dim=8,
                            global_states_input_dim=16, cross_attention_input_dim=16),
    "t5-film": t5_film,
    "prior": denoise(D.PriorTransformer, (8,), prior_inputs,
                     num_attention_heads=2, attention_head_dim=4, num_layers=2, embedding_dim=8, num_embeddings=7,
                     additional_embeddings=4, dropout=0.1),
    "uvit2d": uvit2d,
}
