"""Tiny random-weight transformers models of many families, for `benchmarks/families.py`.

`FAMILIES`: family -> factory() returning (model, args, kwargs, loss_of), the model in
training mode with its default dropouts and SpecAugment masks (NumPy's draws: the speech
models' `mask_time_prob`, drawn at every step as eager draws them), layer drop off (a
Python branch on a draw, which remat-ir refuses by line). Each is a few
thousand parameters: the sweep looks for models that train otherwise than eager, not
for speed. Families of `zoo_models` and `tests/torch_models.py` are left out, as are
those whose tiny config fails in eager PyTorch itself (dbrx, zamba, bit, cvt at
transformers 5.24). Also left out: resnet (in `tests/torch_models.py`), dinat (needs the
natten package), detr, yolos and other detectors (their loss matches with SciPy's
Hungarian solver), zoedepth and superpoint; nezha and trajectory_transformer are no longer
in transformers 5.24."""
import torch
import transformers as T

B, S, V, H = 2, 16, 128, 32


def quiet():
    from transformers.utils import logging
    logging.set_verbosity_error()


def ids(lo=3, seq=S):
    return torch.randint(lo, V, (B, seq))


def loss(out):
    return out.loss


def enc_common():
    return dict(vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=64, max_position_embeddings=64)


def mlm(cfg_cls, model_cls, **extra):
    def f():
        cfg = cfg_cls(**{**enc_common(), **extra})
        m = model_cls(cfg).train()
        x = ids()
        return m, (), dict(input_ids=x, labels=x), loss
    return f


def seqcls(cfg_cls, model_cls, **extra):
    def f():
        cfg = cfg_cls(**{**enc_common(), "num_labels": 3, **extra})
        m = model_cls(cfg).train()
        x = ids()
        return m, (), dict(input_ids=x, labels=torch.tensor([0, 2])), loss
    return f


def clm(cfg_cls, model_cls, common=True, **extra):
    def f():
        base = dict(vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=64, use_cache=False) if common else dict(use_cache=False)
        cfg = cfg_cls(**{**base, **extra})
        m = model_cls(cfg).train()
        x = ids()
        return m, (), dict(input_ids=x, labels=x), loss
    return f


def seq2seq(cfg_cls, model_cls, **extra):
    def f():
        cfg = cfg_cls(**{**dict(vocab_size=V, d_model=H, encoder_layers=2, decoder_layers=2,
                                 encoder_attention_heads=2, decoder_attention_heads=2,
                                 encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                                 pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                 decoder_start_token_id=2, use_cache=False,
                                 encoder_layerdrop=0.0, decoder_layerdrop=0.0), **extra})
        m = model_cls(cfg).train()
        return m, (), dict(input_ids=ids(), labels=ids(seq=8)), loss
    return f


def imgcls(cfg_cls, model_cls, image=32, **extra):
    def f():
        cfg = cfg_cls(**{**dict(num_labels=3), **extra})
        m = model_cls(cfg).train()
        px = torch.randn(B, 3, image, image)
        return m, (), dict(pixel_values=px, labels=torch.tensor([0, 2])), loss
    return f


def vit_like(cfg_cls, model_cls, **extra):
    return imgcls(cfg_cls, model_cls, **{**dict(hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                                              intermediate_size=64, image_size=32, patch_size=8), **extra})


def ctc(cfg_cls, model_cls, **extra):
    def f():
        cfg = cfg_cls(**{**dict(vocab_size=32, hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
                                 conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                 num_conv_pos_embedding_groups=2, mask_feature_prob=0.1,
                                 mask_feature_length=4, layerdrop=0.0, pad_token_id=0,
                                 ctc_loss_reduction="mean"), **extra})
        m = model_cls(cfg).train()
        audio = torch.randn(B, 1600)
        labels = torch.randint(1, 32, (B, 5))
        return m, (), dict(input_values=audio, labels=labels), loss
    return f


def clip_like(cfg_cls, text_kw, vis_kw):
    def f():
        cfg = cfg_cls(text_config=dict(vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, max_position_embeddings=64, **text_kw),
                      vision_config=dict(hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, image_size=32, patch_size=8, **vis_kw),
                      **({"projection_dim": 16} if cfg_cls is T.CLIPConfig else {}))
        m = getattr(T, cfg_cls.__name__.replace("Config", "Model"))(cfg).train()
        kw = dict(input_ids=ids(), pixel_values=torch.randn(B, 3, 32, 32), return_loss=True)
        return m, (), kw, loss
    return f


def video(cfg_cls, model_cls, **extra):
    def f():
        cfg = cfg_cls(**{**dict(hidden_size=H, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                 image_size=16, num_frames=4, num_labels=3), **extra})
        m = model_cls(cfg).train()
        px = torch.randn(B, 4, 3, 16, 16)
        return m, (), dict(pixel_values=px, labels=torch.tensor([0, 2])), loss
    return f


def speecht5():
    cfg = T.SpeechT5Config(vocab_size=V, hidden_size=H, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                           decoder_ffn_dim=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                           num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
                           encoder_layerdrop=0.0,
                           decoder_layerdrop=0.0, use_cache=False, speech_decoder_prenet_units=16,
                           speech_decoder_postnet_units=16, speaker_embedding_dim=16)
    m = T.SpeechT5ForSpeechToText(cfg).train()
    return m, (), dict(input_values=torch.randn(B, 1600), labels=ids(seq=6)), loss


def canine():
    cfg = T.CanineConfig(hidden_size=H, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=64, num_hash_functions=4, num_hash_buckets=64,
                         downsampling_rate=4, local_transformer_stride=4, num_labels=3)
    m = T.CanineForSequenceClassification(cfg).train()
    x = torch.randint(0, 1000, (B, S))
    return m, (), dict(input_ids=x, labels=torch.tensor([0, 2])), loss


FAMILIES = {
    "albert": mlm(T.AlbertConfig, T.AlbertForMaskedLM, embedding_size=16),
    "roberta": mlm(T.RobertaConfig, T.RobertaForMaskedLM),
    "xlm-roberta": mlm(T.XLMRobertaConfig, T.XLMRobertaForMaskedLM),
    "electra": mlm(T.ElectraConfig, T.ElectraForMaskedLM, embedding_size=16),
    "deberta-v2": mlm(T.DebertaV2Config, T.DebertaV2ForMaskedLM, relative_attention=True,
                      position_buckets=8, pos_att_type=["p2c", "c2p"]),
    "mpnet": mlm(T.MPNetConfig, T.MPNetForMaskedLM),
    "funnel": lambda: _funnel(),
    "bart": seq2seq(T.BartConfig, T.BartForConditionalGeneration),
    "mbart": seq2seq(T.MBartConfig, T.MBartForConditionalGeneration),
    "pegasus": seq2seq(T.PegasusConfig, T.PegasusForConditionalGeneration),
    "marian": seq2seq(T.MarianConfig, T.MarianMTModel, decoder_vocab_size=V, pad_token_id=V - 1),
    "opt": clm(T.OPTConfig, T.OPTForCausalLM, common=False, vocab_size=V, hidden_size=H, num_hidden_layers=2,
               num_attention_heads=2, ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=H,
               layerdrop=0.0, pad_token_id=1),
    "bloom": clm(T.BloomConfig, T.BloomForCausalLM, common=False, vocab_size=V, hidden_size=H, n_layer=2, n_head=2,
                 hidden_dropout=0.1, attention_dropout=0.1),
    "falcon": clm(T.FalconConfig, T.FalconForCausalLM, common=False, vocab_size=V, hidden_size=H,
                  num_hidden_layers=2, num_attention_heads=2, hidden_dropout=0.1, attention_dropout=0.1),
    "gpt-neo": clm(T.GPTNeoConfig, T.GPTNeoForCausalLM, common=False, vocab_size=V, hidden_size=H, num_layers=2,
                   num_heads=2, attention_types=[[["global", "local"], 1]], window_size=8,
                   max_position_embeddings=64, intermediate_size=64),
    "gptj": clm(T.GPTJConfig, T.GPTJForCausalLM, common=False, vocab_size=V, n_embd=H, n_layer=2, n_head=2,
                n_positions=64, rotary_dim=8, n_inner=64),
    "phi": clm(T.PhiConfig, T.PhiForCausalLM, partial_rotary_factor=0.5, resid_pdrop=0.1, embd_pdrop=0.1,
               attention_dropout=0.1),
    "phi3": clm(T.Phi3Config, T.Phi3ForCausalLM, resid_pdrop=0.1, embd_pdrop=0.1, attention_dropout=0.1,
                pad_token_id=0),
    "gemma": clm(T.GemmaConfig, T.GemmaForCausalLM, head_dim=16, num_key_value_heads=1),
    "gemma2": clm(T.Gemma2Config, T.Gemma2ForCausalLM, head_dim=16, num_key_value_heads=1, sliding_window=8),
    "gemma3": clm(T.Gemma3TextConfig, T.Gemma3ForCausalLM, head_dim=16, num_key_value_heads=1, sliding_window=8),
    "starcoder2": clm(T.Starcoder2Config, T.Starcoder2ForCausalLM, num_key_value_heads=1, residual_dropout=0.1,
                      embedding_dropout=0.1, attention_dropout=0.1),
    "stablelm": clm(T.StableLmConfig, T.StableLmForCausalLM, num_key_value_heads=2, partial_rotary_factor=0.5,
                    hidden_dropout=0.1, attention_dropout=0.1),
    "olmo": clm(T.OlmoConfig, T.OlmoForCausalLM, attention_dropout=0.1, pad_token_id=1),
    "olmo2": clm(T.Olmo2Config, T.Olmo2ForCausalLM, attention_dropout=0.1, pad_token_id=1),
    "cohere": clm(T.CohereConfig, T.CohereForCausalLM, pad_token_id=0),
    "mixtral": clm(T.MixtralConfig, T.MixtralForCausalLM, num_key_value_heads=1, num_local_experts=4,
                   num_experts_per_tok=2, output_router_logits=True),
    "qwen2-moe": clm(T.Qwen2MoeConfig, T.Qwen2MoeForCausalLM, num_key_value_heads=1, num_experts=4,
                     num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                     output_router_logits=True),
    "jamba": clm(T.JambaConfig, T.JambaForCausalLM, num_key_value_heads=1, num_experts=2, num_experts_per_tok=1,
                 mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4, attn_layer_period=2,
                 attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, use_mamba_kernels=False),
    "mamba": clm(T.MambaConfig, T.MambaForCausalLM, common=False, vocab_size=V, hidden_size=H,
                 num_hidden_layers=2, state_size=4, expand=2, conv_kernel=4, use_mambapy=False),
    "mamba2": clm(T.Mamba2Config, T.Mamba2ForCausalLM, common=False, vocab_size=V, hidden_size=H,
                  num_hidden_layers=2, state_size=8, expand=2, conv_kernel=4, num_heads=4, head_dim=16,
                  n_groups=1, chunk_size=8),
    "rwkv": clm(T.RwkvConfig, T.RwkvForCausalLM, common=False, vocab_size=V, hidden_size=H, num_hidden_layers=2,
                attention_hidden_size=H, intermediate_size=64, context_length=64),
    "big_bird": lambda: _bigbird(),
    "reformer": lambda: _reformer(),
    "xlnet": lambda: _xlnet(),
    "longformer": mlm(T.LongformerConfig, T.LongformerForMaskedLM, attention_window=4, pad_token_id=1,
                      max_position_embeddings=64),
    "led": seq2seq(T.LEDConfig, T.LEDForConditionalGeneration, attention_window=4, max_encoder_position_embeddings=64,
                   max_decoder_position_embeddings=64),
    "fnet": mlm(T.FNetConfig, T.FNetForMaskedLM, use_tpu_fourier_optimizations=False),
    "canine": canine,
    "convnext": imgcls(T.ConvNextConfig, T.ConvNextForImageClassification, hidden_sizes=[8, 16], depths=[1, 1],
                       num_stages=2, patch_size=4, drop_path_rate=0.1),
    "deit": vit_like(T.DeiTConfig, T.DeiTForImageClassification, hidden_dropout_prob=0.1,
                     attention_probs_dropout_prob=0.1),
    "mobilevit": imgcls(T.MobileViTConfig, T.MobileViTForImageClassification, image_size=32,
                        hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
                        num_attention_heads=2, patch_size=2),
    "segformer": imgcls(T.SegformerConfig, T.SegformerForImageClassification, num_encoder_blocks=2,
                        depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3],
                        strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], drop_path_rate=0.1,
                        decoder_hidden_size=16),
    "dinov2": vit_like(T.Dinov2Config, T.Dinov2ForImageClassification, drop_path_rate=0.1,
                       hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),
    "clip": clip_like(T.CLIPConfig, {}, {}),
    "siglip": clip_like(T.SiglipConfig, {}, {}),
    "hubert": ctc(T.HubertConfig, T.HubertForCTC),
    # No feature masks: WavLM's config has no `mask_feature_min_masks`, which its forward
    # reads where `mask_feature_prob > 0` (eager fails, transformers 5.24).
    "wavlm": ctc(T.WavLMConfig, T.WavLMForCTC, num_buckets=16, max_bucket_distance=32, mask_feature_prob=0.0),
    "data2vec-audio": ctc(T.Data2VecAudioConfig, T.Data2VecAudioForCTC, conv_pos_kernel_size=4,
                          num_conv_pos_embeddings=4),
    "speecht5": speecht5,
    "vivit": video(T.VivitConfig, T.VivitForVideoClassification, tubelet_size=[2, 8, 8], hidden_dropout_prob=0.1),
    "videomae": video(T.VideoMAEConfig, T.VideoMAEForVideoClassification, patch_size=8, tubelet_size=2,
                      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),
}


def _funnel():
    cfg = T.FunnelConfig(vocab_size=V, block_sizes=[1, 1], num_decoder_layers=1, d_model=H, n_head=2, d_head=16,
                         d_inner=64, max_position_embeddings=64)
    m = T.FunnelForMaskedLM(cfg).train()
    x = ids()
    return m, (), dict(input_ids=x, labels=x), loss


def _bigbird():
    # block_sparse needs seq > (5 + 2*num_random_blocks) * block_size: 8 blocks of 4 -> seq 64
    cfg = T.BigBirdConfig(**{**enc_common(), "max_position_embeddings": 128}, attention_type="block_sparse",
                          block_size=4, num_random_blocks=2)
    m = T.BigBirdForMaskedLM(cfg).train()
    x = torch.randint(3, V, (B, 64))
    return m, (), dict(input_ids=x, labels=x), loss


def _reformer():
    cfg = T.ReformerConfig(vocab_size=V, hidden_size=H, num_attention_heads=2, attention_head_size=16,
                           attn_layers=["local", "lsh"], feed_forward_size=64, axial_pos_embds=True,
                           axial_pos_shape=[4, 8], axial_pos_embds_dim=[16, 16], max_position_embeddings=32,
                           local_attn_chunk_length=8, lsh_attn_chunk_length=8, num_buckets=4, num_hashes=1,
                           is_decoder=True, hidden_dropout_prob=0.1, use_cache=False, pad_token_id=0,
                           eos_token_id=2)
    m = T.ReformerModelWithLMHead(cfg).train()
    x = torch.randint(3, V, (B, 32))
    return m, (), dict(input_ids=x, labels=x), loss


def _xlnet():
    cfg = T.XLNetConfig(vocab_size=V, d_model=H, n_layer=2, n_head=2, d_inner=64, mem_len=None, use_mems_train=False)
    m = T.XLNetLMHeadModel(cfg).train()
    x = ids()
    return m, (), dict(input_ids=x, labels=x), loss


def _vitmae():
    cfg = T.ViTMAEConfig(hidden_size=H, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         image_size=32, patch_size=8, decoder_hidden_size=16, decoder_num_hidden_layers=1,
                         decoder_num_attention_heads=2, decoder_intermediate_size=32, mask_ratio=0.75,
                         hidden_dropout_prob=0.1)
    m = T.ViTMAEForPreTraining(cfg).train()
    return m, (), dict(pixel_values=torch.randn(B, 3, 32, 32)), loss


def _switch():
    cfg = T.SwitchTransformersConfig(vocab_size=V, d_model=H, d_kv=8, d_ff=64, expert_capacity=8, num_layers=2,
                                     num_sparse_encoder_layers=1, num_decoder_layers=2, num_sparse_decoder_layers=1,
                                     num_heads=2, num_experts=4, router_jitter_noise=0.01, decoder_start_token_id=0,
                                     pad_token_id=0, use_cache=False)
    m = T.SwitchTransformersForConditionalGeneration(cfg).train()
    return m, (), dict(input_ids=ids(), labels=ids(seq=8)), loss


def _nllb_moe():
    cfg = T.NllbMoeConfig(vocab_size=V, d_model=H, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                          decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_experts=4,
                          expert_capacity=8, encoder_sparse_step=2, decoder_sparse_step=2, max_position_embeddings=64,
                          router_z_loss_coef=0.001, router_aux_loss_coef=0.001, moe_token_dropout=0.2,
                          encoder_layerdrop=0.0, decoder_layerdrop=0.0, use_cache=False, pad_token_id=1,
                          bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, output_router_logits=True)
    m = T.NllbMoeForConditionalGeneration(cfg).train()
    return m, (), dict(input_ids=ids(), labels=ids(seq=8)), loss


def _groupvit():
    cfg = T.GroupViTConfig(text_config=dict(vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                                            intermediate_size=64, max_position_embeddings=64),
                           vision_config=dict(hidden_size=H, num_hidden_layers=2, depths=[1, 1], num_group_tokens=[8, 0],
                                              num_output_groups=[4, 4], num_attention_heads=2, intermediate_size=64,
                                              image_size=32, patch_size=8),
                           projection_dim=16, projection_intermediate_dim=32)
    m = T.GroupViTModel(cfg).train()
    return m, (), dict(input_ids=ids(), pixel_values=torch.randn(B, 3, 32, 32), return_loss=True), loss


def _prophetnet():
    cfg = T.ProphetNetConfig(vocab_size=V, hidden_size=H, encoder_ffn_dim=64, decoder_ffn_dim=64, num_encoder_layers=2,
                             num_decoder_layers=2, num_encoder_attention_heads=2, num_decoder_attention_heads=2,
                             max_position_embeddings=64, ngram=2, num_buckets=8, relative_max_distance=16,
                             use_cache=False, pad_token_id=0, decoder_start_token_id=0)
    m = T.ProphetNetForConditionalGeneration(cfg).train()
    return m, (), dict(input_ids=ids(), labels=ids(seq=8)), loss


def _patchtst():
    cfg = T.PatchTSTConfig(num_input_channels=3, context_length=32, patch_length=8, patch_stride=8, prediction_length=8,
                           d_model=16, num_attention_heads=2, num_hidden_layers=2, ffn_dim=32, dropout=0.1,
                           path_dropout=0.1)
    m = T.PatchTSTForPrediction(cfg).train()
    return m, (), dict(past_values=torch.randn(B, 32, 3), future_values=torch.randn(B, 8, 3)), loss


def _modernbert():
    cfg = T.ModernBertConfig(vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=64, max_position_embeddings=64, local_attention=8,
                             global_attn_every_n_layers=2, attention_dropout=0.1, embedding_dropout=0.1,
                             mlp_dropout=0.1, reference_compile=False, pad_token_id=0)
    m = T.ModernBertForMaskedLM(cfg).train()
    x = ids()
    return m, (), dict(input_ids=x, labels=x), loss


def _xlstm():
    cfg = T.xLSTMConfig(vocab_size=V, hidden_size=H, num_hidden_layers=2, num_heads=2, chunk_size=8, use_cache=False,
                        mode="train", chunkwise_kernel="chunkwise--native_autograd",
                        sequence_kernel="native_sequence__native", step_kernel="native")
    m = T.xLSTMForCausalLM(cfg).train()
    x = ids()
    return m, (), dict(input_ids=x, labels=x), loss


FAMILIES.update({
    "vit_mae": _vitmae,
    "switch_transformers": _switch,
    "nllb_moe": _nllb_moe,
    "groupvit": _groupvit,
    "prophetnet": _prophetnet,
    "patchtst": _patchtst,
    "modernbert": _modernbert,
    "xlstm": _xlstm,
    "gpt_oss": clm(T.GptOssConfig, T.GptOssForCausalLM, num_key_value_heads=1, head_dim=16, num_local_experts=4,
                   num_experts_per_tok=2, sliding_window=8, output_router_logits=True, attention_dropout=0.1),
    "olmoe": clm(T.OlmoeConfig, T.OlmoeForCausalLM, num_key_value_heads=1, num_experts=4, num_experts_per_tok=2,
                 output_router_logits=True, pad_token_id=1),
    "deepseek_v3": clm(T.DeepseekV3Config, T.DeepseekV3ForCausalLM, num_key_value_heads=2, n_routed_experts=4,
                       num_experts_per_tok=2, n_group=2, topk_group=1, moe_intermediate_size=16, n_shared_experts=1,
                       first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                       qk_nope_head_dim=8, v_head_dim=16, attention_dropout=0.1),
    "granitemoe": clm(T.GraniteMoeConfig, T.GraniteMoeForCausalLM, num_key_value_heads=1, num_local_experts=4,
                      num_experts_per_tok=2, output_router_logits=True, embedding_multiplier=2.0,
                      attention_dropout=0.1),
    "convbert": mlm(T.ConvBertConfig, T.ConvBertForMaskedLM, embedding_size=16, conv_kernel_size=3),
    "squeezebert": mlm(T.SqueezeBertConfig, T.SqueezeBertForMaskedLM, embedding_size=H, q_groups=2, k_groups=2,
                       v_groups=2, post_attention_groups=2, intermediate_groups=2, output_groups=2),
    "mobilebert": mlm(T.MobileBertConfig, T.MobileBertForMaskedLM, embedding_size=16, intra_bottleneck_size=16,
                      true_hidden_size=16, num_feedforward_networks=2),
    "esm": mlm(T.EsmConfig, T.EsmForMaskedLM, pad_token_id=1, mask_token_id=2, position_embedding_type="rotary",
               token_dropout=True),
    "nystromformer": mlm(T.NystromformerConfig, T.NystromformerForMaskedLM, num_landmarks=4, segment_means_seq_len=16,
                         conv_kernel_size=3, max_position_embeddings=64),
    "deberta": mlm(T.DebertaConfig, T.DebertaForMaskedLM, relative_attention=True, pos_att_type=["p2c", "c2p"]),
    "recurrent_gemma": clm(T.RecurrentGemmaConfig, T.RecurrentGemmaForCausalLM, num_key_value_heads=1, lru_width=H,
                           attention_window_size=8, block_types=["recurrent", "attention"], conv1d_width=4),
    "bamba": clm(T.BambaConfig, T.BambaForCausalLM, num_key_value_heads=1, mamba_n_heads=4, mamba_d_head=16,
                 mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8,
                 attn_layer_indices=[1]),
    "swinv2": imgcls(T.Swinv2Config, T.Swinv2ForImageClassification, image_size=32, patch_size=4, embed_dim=16,
                     depths=[1, 1], num_heads=[2, 2], window_size=4, drop_path_rate=0.1),
    "levit": imgcls(T.LevitConfig, T.LevitForImageClassification, image_size=32, hidden_sizes=[16, 32, 48],
                    num_attention_heads=[1, 2, 3], depths=[1, 1, 1], key_dim=[8, 8, 8], patch_size=16,
                    drop_path_rate=0),
    "efficientnet": imgcls(T.EfficientNetConfig, T.EfficientNetForImageClassification, image_size=32,
                           width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320, drop_connect_rate=0.2),
    "mobilenet_v2": imgcls(T.MobileNetV2Config, T.MobileNetV2ForImageClassification, image_size=32,
                           depth_multiplier=0.25),
    "focalnet": imgcls(T.FocalNetConfig, T.FocalNetForImageClassification, image_size=32, patch_size=4, embed_dim=16,
                       depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3], drop_path_rate=0.1),
    "unispeech": ctc(T.UniSpeechConfig, T.UniSpeechForCTC),
    "wav2vec2-conformer": ctc(T.Wav2Vec2ConformerConfig, T.Wav2Vec2ConformerForCTC, position_embeddings_type="rotary",
                              conv_depthwise_kernel_size=3),
    "sew": ctc(T.SEWConfig, T.SEWForCTC, squeeze_factor=2),
    "blenderbot": seq2seq(T.BlenderbotConfig, T.BlenderbotForConditionalGeneration),
    "m2m100": seq2seq(T.M2M100Config, T.M2M100ForConditionalGeneration),
    "data2vec-vision": vit_like(T.Data2VecVisionConfig, T.Data2VecVisionForImageClassification,
                                use_relative_position_bias=True, drop_path_rate=0.1),
})


def _switch_mask():
    m, a, k, l = _switch()
    k["attention_mask"] = torch.ones_like(k["input_ids"])
    return m, a, k, l


FAMILIES.update({
    "switch_transformers+mask": _switch_mask,
    "mpt": clm(T.MptConfig, T.MptForCausalLM, common=False, vocab_size=V, d_model=H, n_layers=2, n_heads=2,
               max_seq_len=64, expansion_ratio=2, resid_pdrop=0.1, emb_pdrop=0.1,
               attn_config=dict(alibi=True)),
    "codegen": clm(T.CodeGenConfig, T.CodeGenForCausalLM, common=False, vocab_size=V, n_embd=H, n_layer=2, n_head=2,
                   n_positions=64, rotary_dim=8, n_inner=64),
    "biogpt": clm(T.BioGptConfig, T.BioGptForCausalLM, layerdrop=0.0),
    "xglm": clm(T.XGLMConfig, T.XGLMForCausalLM, common=False, vocab_size=V, d_model=H, num_layers=2,
                attention_heads=2, ffn_dim=64, max_position_embeddings=64, layerdrop=0.0),
    "persimmon": clm(T.PersimmonConfig, T.PersimmonForCausalLM, qk_layernorm=True, hidden_dropout=0.1,
                     attention_dropout=0.1, partial_rotary_factor=0.5),
    "granite": clm(T.GraniteConfig, T.GraniteForCausalLM, num_key_value_heads=1, attention_dropout=0.1,
                   embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=2.0),
    "nemotron": clm(T.NemotronConfig, T.NemotronForCausalLM, num_key_value_heads=1, attention_dropout=0.1,
                    partial_rotary_factor=0.5, head_dim=16),
    "qwen3": clm(T.Qwen3Config, T.Qwen3ForCausalLM, num_key_value_heads=1, head_dim=16, attention_dropout=0.1),
    "smollm3": clm(T.SmolLM3Config, T.SmolLM3ForCausalLM, num_key_value_heads=1, attention_dropout=0.1,
                   pad_token_id=0),
    "glm": clm(T.GlmConfig, T.GlmForCausalLM, num_key_value_heads=1, head_dim=16, attention_dropout=0.1, pad_token_id=0),
    "helium": clm(T.HeliumConfig, T.HeliumForCausalLM, num_key_value_heads=1, head_dim=16, attention_dropout=0.1,
                  pad_token_id=0),
    "umt5": lambda: _t5like(T.UMT5Config, T.UMT5ForConditionalGeneration),
    "mt5": lambda: _t5like(T.MT5Config, T.MT5ForConditionalGeneration),
})


def _t5like(cfg_cls, model_cls):
    cfg = cfg_cls(vocab_size=V, d_model=H, d_kv=8, d_ff=64, num_layers=2, num_heads=2, decoder_start_token_id=0,
                  pad_token_id=0, dropout_rate=0.1, use_cache=False, feed_forward_proj="gated-gelu")
    m = model_cls(cfg).train()
    return m, (), dict(input_ids=ids(), labels=ids(seq=8)), loss


# --- More families: vision backbones and dense heads, layout/markup encoders, multimodal, time series, audio.


def reduce_out(*fields):
    """A loss for outputs without one: the mean square of the named output tensors."""
    def f(out):
        return sum(getattr(out, k).float().pow(2).mean() for k in fields)
    return f


def _small_vit(**extra):
    return dict(hidden_size=H, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
                patch_size=8, **extra)


def _small_text(**extra):
    return {**enc_common(), **extra}


def _beit_mim():
    cfg = T.BeitConfig(**_small_vit(), vocab_size=64, use_mask_token=True, use_shared_relative_position_bias=True,
                       layer_scale_init_value=0.1, drop_path_rate=0.1, hidden_dropout_prob=0.1)
    m = T.BeitForMaskedImageModeling(cfg).train()
    mask = torch.zeros(B, 16, dtype=torch.bool)
    mask[:, ::3] = True
    labels = torch.randint(0, 64, (int(mask.sum()),))
    return m, (), dict(pixel_values=torch.randn(B, 3, 32, 32), bool_masked_pos=mask, labels=labels), loss


def _dpt_seg():
    cfg = T.DPTConfig(hidden_size=H, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64, image_size=32,
                      patch_size=8, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 8, 16, 16],
                      fusion_hidden_size=8, num_labels=3, use_auxiliary_head=True, hidden_dropout_prob=0.1)
    m = T.DPTForSemanticSegmentation(cfg).train()
    return m, (), dict(pixel_values=torch.randn(B, 3, 32, 32), labels=torch.randint(0, 3, (B, 32, 32))), loss


def _glpn():
    cfg = T.GLPNConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                       patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                       decoder_hidden_size=16, drop_path_rate=0.1, max_depth=10)
    m = T.GLPNForDepthEstimation(cfg).train()
    return m, (), dict(pixel_values=torch.randn(B, 3, 32, 32), labels=torch.rand(B, 32, 32) * 5 + 0.1), loss


def _upernet():
    # the auxiliary head reads the third stage
    backbone = T.ConvNextConfig(hidden_sizes=[8, 12, 16], depths=[1, 1, 1], num_stages=3, patch_size=4,
                                drop_path_rate=0.1, out_features=["stage1", "stage2", "stage3"])
    cfg = T.UperNetConfig(backbone_config=backbone, hidden_size=16, pool_scales=[1, 2], use_auxiliary_head=True,
                          auxiliary_channels=8, num_labels=3)
    m = T.UperNetForSemanticSegmentation(cfg).train()
    return m, (), dict(pixel_values=torch.randn(B, 3, 32, 32), labels=torch.randint(0, 3, (B, 32, 32))), loss


def _ast():
    cfg = T.ASTConfig(hidden_size=H, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, patch_size=8,
                      frequency_stride=8, time_stride=8, max_length=32, num_mel_bins=16, num_labels=3,
                      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    m = T.ASTForAudioClassification(cfg).train()
    return m, (), dict(input_values=torch.randn(B, 32, 16), labels=torch.tensor([0, 2])), loss


def _bbox(seq=S, hi=64):
    a = torch.randint(0, hi // 2, (B, seq, 2))
    return torch.cat([a, a + torch.randint(0, hi // 2, (B, seq, 2))], -1)


def _layoutlm():
    cfg = T.LayoutLMConfig(**_small_text(), max_2d_position_embeddings=64)
    m = T.LayoutLMForMaskedLM(cfg).train()
    x = ids()
    return m, (), dict(input_ids=x, bbox=_bbox(), labels=x), loss


def _lilt():
    # six layout embeddings of hidden_size // 6 each: a hidden size that 6 divides
    cfg = T.LiltConfig(**{**_small_text(), "hidden_size": 48}, max_2d_position_embeddings=64, channel_shrink_ratio=4,
                       num_labels=3, pad_token_id=1)
    m = T.LiltForTokenClassification(cfg).train()
    return m, (), dict(input_ids=ids(), bbox=_bbox(), labels=torch.randint(0, 3, (B, S))), loss


def _bros():
    # hidden_size // 4 // dim_bbox sinusoid channels per coordinate: 2 with 4 coordinates
    cfg = T.BrosConfig(**_small_text(), dim_bbox=4, num_labels=3)
    m = T.BrosForTokenClassification(cfg).train()
    box = torch.rand(B, S, 4)
    return m, (), dict(input_ids=ids(), bbox=box, labels=torch.randint(0, 3, (B, S))), loss


def _markuplm():
    cfg = T.MarkupLMConfig(**_small_text(), max_depth=4, max_xpath_tag_unit_embeddings=16,
                           max_xpath_subs_unit_embeddings=16, tag_pad_id=15, subs_pad_id=15, xpath_unit_hidden_size=8,
                           num_labels=3, pad_token_id=1)
    m = T.MarkupLMForTokenClassification(cfg).train()
    return m, (), dict(input_ids=ids(), xpath_tags_seq=torch.randint(0, 16, (B, S, 4)),
                       xpath_subs_seq=torch.randint(0, 16, (B, S, 4)), labels=torch.randint(0, 3, (B, S))), loss


def _xmod():
    cfg = T.XmodConfig(**_small_text(), pad_token_id=1, languages=["en_XX", "de_DE"], default_language="en_XX",
                       adapter_reduction_factor=4)
    m = T.XmodForMaskedLM(cfg).train()
    x = ids()
    return m, (), dict(input_ids=x, lang_ids=torch.tensor([0, 1]), labels=x), loss


def _visual_bert():
    cfg = T.VisualBertConfig(**_small_text(), visual_embedding_dim=16)
    m = T.VisualBertForPreTraining(cfg).train()
    x = ids()
    n = 4
    return m, (), dict(input_ids=x, attention_mask=torch.ones(B, S, dtype=torch.long),
                       visual_embeds=torch.randn(B, n, 16), visual_attention_mask=torch.ones(B, n, dtype=torch.long),
                       labels=torch.cat([x, torch.full((B, n), -100)], 1),
                       sentence_image_labels=torch.tensor([0, 1])), loss


def _roc_bert():
    cfg = T.RoCBertConfig(**_small_text(), pronunciation_vocab_size=16, pronunciation_embed_dim=8,
                          shape_vocab_size=16, shape_embed_dim=8, concat_input=True)
    m = T.RoCBertForMaskedLM(cfg).train()
    x = ids()
    return m, (), dict(input_ids=x, input_shape_ids=torch.randint(0, 16, (B, S)),
                       input_pronunciation_ids=torch.randint(0, 16, (B, S)), labels=x), loss


def _luke():
    cfg = T.LukeConfig(**_small_text(), entity_vocab_size=16, entity_emb_size=16, use_entity_aware_attention=True)
    m = T.LukeForMaskedLM(cfg).train()
    x = ids()
    pos = torch.arange(4).expand(B, 3, 4) + torch.tensor([0, 5, 10]).view(1, 3, 1)
    return m, (), dict(input_ids=x, labels=x, entity_ids=torch.randint(1, 16, (B, 3)),
                       entity_position_ids=pos, entity_attention_mask=torch.ones(B, 3, dtype=torch.long),
                       entity_labels=torch.randint(1, 16, (B, 3))), loss


def _tapas():
    cfg = T.TapasConfig(**_small_text(), type_vocab_sizes=[3, 8, 8, 2, 8, 8, 4])
    m = T.TapasForMaskedLM(cfg).train()
    x = ids()
    tt = torch.stack([torch.randint(0, n, (B, S)) for n in [3, 8, 8, 2, 8, 8, 4]], -1)
    return m, (), dict(input_ids=x, token_type_ids=tt, labels=x), loss


def _t5gemma():
    mod = dict(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
               num_key_value_heads=1, head_dim=16, max_position_embeddings=64, sliding_window=8, use_cache=False,
               pad_token_id=0, bos_token_id=2, eos_token_id=1)
    cfg = T.T5GemmaConfig(encoder=T.T5GemmaModuleConfig(**mod), decoder=T.T5GemmaModuleConfig(**mod), vocab_size=V,
                          dropout_rate=0.1, attention_dropout=0.1)
    m = T.T5GemmaForConditionalGeneration(cfg).train()
    return m, (), dict(input_ids=ids(), labels=ids(seq=8)), loss


def _longt5():
    cfg = T.LongT5Config(vocab_size=V, d_model=H, d_kv=8, d_ff=64, num_layers=2, num_heads=2, local_radius=4,
                         global_block_size=4, encoder_attention_type="transient-global", decoder_start_token_id=0,
                         pad_token_id=0, dropout_rate=0.1, use_cache=False)
    m = T.LongT5ForConditionalGeneration(cfg).train()
    # a mask: without one, a traced encoder takes a mask-less branch whose position bias has batch 1 (cat fails)
    return m, (), dict(input_ids=ids(), attention_mask=torch.ones(B, S, dtype=torch.long), labels=ids(seq=8)), loss


def _speech2text():
    cfg = T.Speech2TextConfig(vocab_size=V, d_model=H, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                              decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                              max_source_positions=64, max_target_positions=64, conv_channels=16,
                              input_feat_per_channel=16, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
                              use_cache=False, dropout=0.1)
    m = T.Speech2TextForConditionalGeneration(cfg).train()
    return m, (), dict(input_features=torch.randn(B, 32, 16), labels=ids(seq=8)), loss


def _moonshine():
    cfg = T.MoonshineConfig(vocab_size=V, hidden_size=H, intermediate_size=64, encoder_num_hidden_layers=2,
                            decoder_num_hidden_layers=2, encoder_num_attention_heads=2, decoder_num_attention_heads=2,
                            max_position_embeddings=64, use_cache=False, attention_dropout=0.1,
                            decoder_start_token_id=1, pad_token_id=0)
    m = T.MoonshineForConditionalGeneration(cfg).train()
    return m, (), dict(input_values=torch.randn(B, 2000), labels=ids(seq=8)), loss


def _bert2bert():
    enc = T.BertConfig(**_small_text())
    dec = T.BertConfig(**_small_text(), is_decoder=True, add_cross_attention=True, use_cache=False)
    cfg = T.EncoderDecoderConfig.from_encoder_decoder_configs(enc, dec, decoder_start_token_id=2, pad_token_id=0)
    m = T.EncoderDecoderModel(config=cfg).train()
    return m, (), dict(input_ids=ids(), labels=ids(seq=8)), loss


def _vit_gpt2():
    enc = T.ViTConfig(**_small_vit())
    dec = T.GPT2Config(vocab_size=V, n_embd=H, n_layer=2, n_head=2, n_positions=64, n_inner=64, is_decoder=True,
                       add_cross_attention=True, use_cache=False)
    cfg = T.VisionEncoderDecoderConfig.from_encoder_decoder_configs(enc, dec, decoder_start_token_id=2,
                                                                    pad_token_id=0)
    m = T.VisionEncoderDecoderModel(config=cfg).train()
    return m, (), dict(pixel_values=torch.randn(B, 3, 32, 32), labels=ids(seq=8)), loss


def _speech_enc_dec():
    enc = T.Wav2Vec2Config(hidden_size=H, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                           num_conv_pos_embedding_groups=2, layerdrop=0.0)
    dec = T.BertConfig(**_small_text(), is_decoder=True, add_cross_attention=True, use_cache=False)
    cfg = T.SpeechEncoderDecoderConfig.from_encoder_decoder_configs(enc, dec, decoder_start_token_id=2,
                                                                    pad_token_id=0)
    m = T.SpeechEncoderDecoderModel(config=cfg).train()
    return m, (), dict(input_values=torch.randn(B, 1600), labels=ids(seq=8)), loss


def _pix2struct():
    cfg = T.Pix2StructConfig(
        vision_config=dict(hidden_size=H, patch_embed_hidden_size=48, d_ff=64, d_kv=16, num_hidden_layers=2,
                           num_attention_heads=2, seq_len=64, dropout_rate=0.1),
        text_config=dict(vocab_size=V, hidden_size=H, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                         dropout_rate=0.1, use_cache=False, decoder_start_token_id=0, pad_token_id=0))
    m = T.Pix2StructForConditionalGeneration(cfg).train()
    n = 16
    rows = torch.arange(n).div(4, rounding_mode="floor") + 1
    cols = torch.arange(n) % 4 + 1
    patches = torch.cat([torch.stack([rows, cols], -1).float().expand(B, n, 2), torch.randn(B, n, 48)], -1)
    return m, (), dict(flattened_patches=patches, attention_mask=torch.ones(B, n), labels=ids(seq=8)), loss


def _blip():
    cfg = T.BlipConfig(text_config=dict(**_small_text(), use_cache=False),
                       vision_config=_small_vit(), projection_dim=16)
    m = T.BlipForConditionalGeneration(cfg).train()
    x = ids()
    return m, (), dict(pixel_values=torch.randn(B, 3, 32, 32), input_ids=x, labels=x), loss


def _owlvit():
    cfg = T.OwlViTConfig(text_config=dict(vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                                          intermediate_size=64, max_position_embeddings=16),
                         vision_config=_small_vit(), projection_dim=H)  # the class head's width: the text's
    m = T.OwlViTForObjectDetection(cfg).train()
    return (m, (), dict(input_ids=ids(seq=16).repeat(2, 1), pixel_values=torch.randn(B, 3, 32, 32)),
            reduce_out("logits", "pred_boxes"))


def _chinese_clip():
    cfg = T.ChineseCLIPConfig(text_config=_small_text(), vision_config=_small_vit(), projection_dim=16)
    m = T.ChineseCLIPModel(cfg).train()
    return m, (), dict(input_ids=ids(), pixel_values=torch.randn(B, 3, 32, 32), return_loss=True), loss


def _altclip():
    cfg = T.AltCLIPConfig(text_config=dict(**_small_text(), project_dim=16, pad_token_id=1),
                          vision_config=_small_vit(), projection_dim=16)
    m = T.AltCLIPModel(cfg).train()
    return m, (), dict(input_ids=ids(), pixel_values=torch.randn(B, 3, 32, 32), return_loss=True), loss


def _git():
    cfg = T.GitConfig(vision_config=_small_vit(), **_small_text(), use_cache=False)
    m = T.GitForCausalLM(cfg).train()
    x = ids()
    return m, (), dict(input_ids=x, pixel_values=torch.randn(B, 3, 32, 32), labels=x), loss


def _vilt():
    cfg = T.ViltConfig(**_small_text(), image_size=32, patch_size=8, max_image_length=-1)
    m = T.ViltForMaskedLM(cfg).train()
    x = ids()
    return m, (), dict(input_ids=x, pixel_values=torch.randn(B, 3, 32, 32), labels=x), loss


def _llava():
    image_token = V - 1
    cfg = T.LlavaConfig(vision_config=T.CLIPVisionConfig(**_small_vit()),
                        text_config=T.LlamaConfig(vocab_size=V, hidden_size=H, num_hidden_layers=2,
                                                  num_attention_heads=2, intermediate_size=64,
                                                  max_position_embeddings=64, use_cache=False),
                        image_token_index=image_token, image_seq_length=16, vision_feature_layer=-1)
    m = T.LlavaForConditionalGeneration(cfg).train()
    x = torch.cat([torch.full((B, 16), image_token), torch.randint(3, V - 1, (B, 8))], 1)
    return m, (), dict(input_ids=x, pixel_values=torch.randn(B, 3, 32, 32), labels=x), loss


def _paligemma():
    image_token = V - 1
    cfg = T.PaliGemmaConfig(vision_config=T.SiglipVisionConfig(**_small_vit()),
                            text_config=T.GemmaConfig(vocab_size=V, hidden_size=H, num_hidden_layers=2,
                                                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                                      intermediate_size=64, max_position_embeddings=64,
                                                      use_cache=False),
                            image_token_index=image_token, projection_dim=H, vocab_size=V)
    m = T.PaliGemmaForConditionalGeneration(cfg).train()
    x = torch.cat([torch.full((B, 16), image_token), torch.randint(3, V - 1, (B, 8))], 1)
    tt = torch.cat([torch.zeros(B, 20, dtype=torch.long), torch.ones(B, 4, dtype=torch.long)], 1)
    return m, (), dict(input_ids=x, pixel_values=torch.randn(B, 3, 32, 32), token_type_ids=tt, labels=x), loss


def _time_series(cfg_cls, model_cls, **extra):
    def f():
        cfg = cfg_cls(**{**dict(prediction_length=4, context_length=8, lags_sequence=[1, 2, 3], num_time_features=1,
                                input_size=1, d_model=16, encoder_layers=2, decoder_layers=2,
                                encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                decoder_ffn_dim=32, encoder_layerdrop=0.0, decoder_layerdrop=0.0, use_cache=False),
                         **extra})
        m = model_cls(cfg).train()
        past = 8 + 3
        return m, (), dict(past_values=torch.randn(B, past), past_time_features=torch.randn(B, past, 1),
                           past_observed_mask=torch.ones(B, past), future_values=torch.randn(B, 4),
                           future_time_features=torch.randn(B, 4, 1)), loss
    return f


def _patchtsmixer():
    cfg = T.PatchTSMixerConfig(context_length=32, patch_length=8, patch_stride=8, num_input_channels=3,
                               prediction_length=8, d_model=16, num_layers=2, expansion_factor=2, dropout=0.1,
                               head_dropout=0.1, mode="mix_channel", gated_attn=True, self_attn=True,
                               self_attn_heads=2)
    m = T.PatchTSMixerForPrediction(cfg).train()
    return m, (), dict(past_values=torch.randn(B, 32, 3), future_values=torch.randn(B, 8, 3)), loss


def _encodec():
    cfg = T.EncodecConfig(target_bandwidths=[1.5], sampling_rate=800, hidden_size=16, num_filters=4,
                          num_residual_layers=1, upsampling_ratios=[4, 2], codebook_size=16, codebook_dim=16,
                          num_lstm_layers=1)
    m = T.EncodecModel(cfg).train()
    return m, (), dict(input_values=torch.randn(B, 1, 800)), reduce_out("audio_values")


def _mimi():
    cfg = T.MimiConfig(sampling_rate=800, hidden_size=16, num_filters=4, upsampling_ratios=[4, 2],
                       codebook_size=16, codebook_dim=16, num_quantizers=2, vector_quantization_hidden_dimension=16,
                       upsample_groups=16, num_hidden_layers=1, intermediate_size=32, num_attention_heads=2,
                       num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=16, frame_rate=50)
    m = T.MimiModel(cfg).train()
    return m, (), dict(input_values=torch.randn(B, 1, 800)), reduce_out("audio_values")


def _dac():
    cfg = T.DacConfig(encoder_hidden_size=4, downsampling_ratios=[2, 4], decoder_hidden_size=16, n_codebooks=2,
                      codebook_size=16, codebook_dim=4, sampling_rate=800, quantizer_dropout=0.5)
    m = T.DacModel(cfg).train()
    # in training its loss is one per sample (quantizer dropout masks them)
    return (m, (), dict(input_values=torch.randn(B, 1, 800)),
            lambda out: out.loss.mean() + out.audio_values.pow(2).mean())


def _musicgen():
    cfg = T.MusicgenDecoderConfig(vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                                  ffn_dim=64, max_position_embeddings=64, num_codebooks=2, layerdrop=0.0,
                                  use_cache=False, pad_token_id=V, bos_token_id=V)
    m = T.MusicgenForCausalLM(cfg).train()
    labels = torch.randint(0, V, (B, S, 2))
    return m, (), dict(input_ids=labels.transpose(1, 2).reshape(B * 2, S), labels=labels), loss


def _decision_transformer():
    cfg = T.DecisionTransformerConfig(state_dim=6, act_dim=3, hidden_size=H, max_ep_len=64, n_layer=2, n_head=2,
                                      n_inner=64, n_positions=64, use_cache=False)
    m = T.DecisionTransformerModel(cfg).train()
    t = 8
    kw = dict(states=torch.randn(B, t, 6), actions=torch.randn(B, t, 3), rewards=torch.randn(B, t, 1),
              returns_to_go=torch.randn(B, t, 1), timesteps=torch.arange(t).expand(B, t),
              attention_mask=torch.ones(B, t, dtype=torch.long))
    return m, (), kw, reduce_out("state_preds", "action_preds", "return_preds")


FAMILIES.update({
    "swin": imgcls(T.SwinConfig, T.SwinForImageClassification, image_size=32, patch_size=4, embed_dim=16,
                   depths=[2, 1], num_heads=[2, 2], window_size=4, drop_path_rate=0.1),
    "regnet": imgcls(T.RegNetConfig, T.RegNetForImageClassification, embedding_size=8, hidden_sizes=[8, 16],
                     depths=[1, 1], groups_width=8, layer_type="y"),
    "poolformer": imgcls(T.PoolFormerConfig, T.PoolFormerForImageClassification, num_encoder_blocks=2, depths=[1, 1],
                         hidden_sizes=[8, 16], patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1], mlp_ratio=2.0,
                         drop_path_rate=0.1),
    "convnextv2": imgcls(T.ConvNextV2Config, T.ConvNextV2ForImageClassification, hidden_sizes=[8, 16], depths=[1, 1],
                         num_stages=2, patch_size=4, drop_path_rate=0.1),
    "beit": vit_like(T.BeitConfig, T.BeitForImageClassification, use_relative_position_bias=True,
                     layer_scale_init_value=0.1, use_mean_pooling=True, drop_path_rate=0.1, hidden_dropout_prob=0.1),
    "beit-mim": _beit_mim,
    "mobilenet_v1": imgcls(T.MobileNetV1Config, T.MobileNetV1ForImageClassification, image_size=32,
                           depth_multiplier=0.125, min_depth=4, classifier_dropout_prob=0.1),
    # 32x32 leaves a 1x1 map at the last stage, below its 2x2 unfolding
    "mobilevitv2": imgcls(T.MobileViTV2Config, T.MobileViTV2ForImageClassification, image=64, image_size=64,
                          width_multiplier=0.125, attn_dropout=0.1, ffn_dropout=0.1),
    "pvt_v2": imgcls(T.PvtV2Config, T.PvtV2ForImageClassification, image_size=32, num_encoder_blocks=2,
                     depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3], strides=[4, 2],
                     num_attention_heads=[1, 2], mlp_ratios=[2, 2], drop_path_rate=0.1, hidden_dropout_prob=0.1),
    "hiera": imgcls(T.HieraConfig, T.HieraForImageClassification, image_size=[32, 32], embed_dim=8,
                    depths=[1, 1], num_heads=[1, 2], num_query_pool=1, masked_unit_size=[4, 4],
                    masked_unit_attention=[True, False], drop_path_rate=0.1),
    "swiftformer": imgcls(T.SwiftFormerConfig, T.SwiftFormerForImageClassification, image_size=32,
                          depths=[1, 1, 1, 1], embed_dims=[8, 8, 16, 16], drop_path_rate=0.1),
    # drop_path_rate is typed int in its config (a float is refused), so no drop path
    "timesformer": video(T.TimesformerConfig, T.TimesformerForVideoClassification, patch_size=8,
                         attention_type="divided_space_time", hidden_dropout_prob=0.1,
                         attention_probs_dropout_prob=0.1),
    "dpt": _dpt_seg,
    "glpn": _glpn,
    "upernet": _upernet,
    "audio_spectrogram_transformer": _ast,
    "layoutlm": _layoutlm,
    "lilt": _lilt,
    "bros": _bros,
    "markuplm": _markuplm,
    "xmod": _xmod,
    "visual_bert": _visual_bert,
    "roc_bert": _roc_bert,
    "luke": _luke,
    "tapas": _tapas,
    "bert-generation": clm(T.BertGenerationConfig, T.BertGenerationDecoder, is_decoder=True),
    "roformer": mlm(T.RoFormerConfig, T.RoFormerForMaskedLM, rotary_value=True),
    "ernie": mlm(T.ErnieConfig, T.ErnieForMaskedLM, use_task_id=True, task_type_vocab_size=3),
    "megatron-bert": mlm(T.MegatronBertConfig, T.MegatronBertForMaskedLM),
    "rembert": mlm(T.RemBertConfig, T.RemBertForMaskedLM, input_embedding_size=16, output_embedding_size=16),
    "ibert": mlm(T.IBertConfig, T.IBertForMaskedLM, quant_mode=False, pad_token_id=1),
    "t5gemma": _t5gemma,
    "longt5": _longt5,
    "speech_to_text": _speech2text,
    "moonshine": _moonshine,
    "encoder_decoder": _bert2bert,
    "vision_encoder_decoder": _vit_gpt2,
    "speech_encoder_decoder": _speech_enc_dec,
    "sew-d": ctc(T.SEWDConfig, T.SEWDForCTC, squeeze_factor=2, position_buckets=8, max_position_embeddings=64),
    "pix2struct": _pix2struct,
    "blip": _blip,
    "owlvit": _owlvit,
    "chinese_clip": _chinese_clip,
    "altclip": _altclip,
    "git": _git,
    "vilt": _vilt,
    "llava": _llava,
    "paligemma": _paligemma,
    "time_series_transformer": _time_series(T.TimeSeriesTransformerConfig, T.TimeSeriesTransformerForPrediction),
    "informer": _time_series(T.InformerConfig, T.InformerForPrediction, attention_type="prob", sampling_factor=2,
                             distil=False),  # distil halves the encoder's length but not its mask
    "autoformer": _time_series(T.AutoformerConfig, T.AutoformerForPrediction, label_length=4, moving_average=3,
                               autocorrelation_factor=1),
    "patchtsmixer": _patchtsmixer,
    "encodec": _encodec,
    "mimi": _mimi,
    "dac": _dac,
    "musicgen": _musicgen,
    "decision_transformer": _decision_transformer,
})


def _wav2vec2_bert():
    cfg = T.Wav2Vec2BertConfig(vocab_size=32, hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, feature_projection_input_dim=16, conv_depthwise_kernel_size=3,
                               left_max_position_embeddings=16, right_max_position_embeddings=4,
                               layerdrop=0.0, hidden_dropout=0.1, attention_dropout=0.1,
                               ctc_loss_reduction="mean", pad_token_id=0)
    m = T.Wav2Vec2BertForCTC(cfg).train()
    return m, (), dict(input_features=torch.randn(B, 32, 16), labels=torch.randint(1, 32, (B, 5))), loss


def _fsmt():
    cfg = T.FSMTConfig(langs=["en", "de"], src_vocab_size=V, tgt_vocab_size=V, d_model=H, max_position_embeddings=64,
                       encoder_ffn_dim=64, encoder_layers=2, encoder_attention_heads=2, decoder_ffn_dim=64,
                       decoder_layers=2, decoder_attention_heads=2, attention_dropout=0.1, use_cache=False)
    m = T.FSMTForConditionalGeneration(cfg).train()
    # without decoder_input_ids it decodes input_ids, not the shifted labels
    y = ids(seq=8)
    dec = torch.cat([torch.full((B, 1), 2), y[:, :-1]], 1)
    return m, (), dict(input_ids=ids(), decoder_input_ids=dec, labels=y), loss


def _seamless_m4t():
    cfg = T.SeamlessM4TConfig(vocab_size=V, hidden_size=H, max_position_embeddings=64, encoder_layers=2,
                              encoder_ffn_dim=64, encoder_attention_heads=2, decoder_layers=2, decoder_ffn_dim=64,
                              decoder_attention_heads=2, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
                              use_cache=False)
    m = T.SeamlessM4TForTextToText(cfg).train()
    return m, (), dict(input_ids=ids(), labels=ids(seq=8)), loss


def _clap():
    cfg = T.ClapConfig(text_config=dict(**_small_text(), pad_token_id=1),
                       audio_config=dict(window_size=4, num_mel_bins=16, spec_size=32, patch_size=4,
                                         patch_stride=[4, 4], hidden_size=H, depths=[1, 1], num_attention_heads=[2, 2],
                                         patch_embeds_hidden_size=16, num_hidden_layers=2, projection_dim=16,
                                         drop_path_rate=0.1),
                       projection_dim=16)
    m = T.ClapModel(cfg).train()
    return m, (), dict(input_ids=ids(), input_features=torch.randn(B, 1, 64, 16), return_loss=True), loss


def _qwen2_vl():
    image, video, start, end = V - 4, V - 3, V - 2, V - 1
    cfg = T.Qwen2VLConfig(
        text_config=dict(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=64, use_cache=False, attention_dropout=0.1,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3])),
        vision_config=dict(depth=2, embed_dim=16, hidden_size=H, num_heads=2, patch_size=4, spatial_merge_size=2,
                           temporal_patch_size=2),
        image_token_id=image, video_token_id=video, vision_start_token_id=start, vision_end_token_id=end)
    m = T.Qwen2VLForConditionalGeneration(cfg).train()
    # one 16x16 image per sample: a 4x4 grid of patches, merged 2x2 into 4 image tokens
    grid = torch.tensor([[1, 4, 4]] * B)
    pixels = torch.randn(B * 16, 3 * 2 * 4 * 4)
    x = torch.cat([torch.full((B, 1), start), torch.full((B, 4), image), torch.full((B, 1), end),
                   torch.randint(3, V - 4, (B, 10))], 1)
    kinds = (x == image).int()   # text 0, image 1
    return m, (), dict(input_ids=x, mm_token_type_ids=kinds, pixel_values=pixels, image_grid_thw=grid, labels=x), loss


def _blip2():
    cfg = T.Blip2Config(vision_config=_small_vit(),
                        qformer_config=dict(vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                                            intermediate_size=64, max_position_embeddings=64, encoder_hidden_size=H),
                        text_config=T.OPTConfig(vocab_size=V, hidden_size=H, num_hidden_layers=2,
                                                num_attention_heads=2, ffn_dim=64, max_position_embeddings=64,
                                                word_embed_proj_dim=H, layerdrop=0.0, pad_token_id=1,
                                                use_cache=False),
                        num_query_tokens=4, image_token_index=V - 1)
    m = T.Blip2ForConditionalGeneration(cfg).train()
    x = torch.cat([torch.full((B, 4), V - 1), torch.randint(3, V - 1, (B, 8))], 1)
    return m, (), dict(pixel_values=torch.randn(B, 3, 32, 32), input_ids=x, labels=x), loss


FAMILIES.update({
    "wav2vec2-bert": _wav2vec2_bert,
    "fsmt": _fsmt,
    "seamless_m4t": _seamless_m4t,
    "clap": _clap,
    "qwen2_vl": _qwen2_vl,
    "blip-2": _blip2,
    "yoso": mlm(T.YosoConfig, T.YosoForMaskedLM, use_fast_hash=False, use_expectation=True, num_hash=4,
                hash_code_len=4, pad_token_id=1),
})
