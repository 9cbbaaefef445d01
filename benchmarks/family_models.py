"""Tiny random-weight transformers models of many families, for `benchmarks/families.py`.

`FAMILIES`: family -> factory() returning (model, args, kwargs, loss_of), the model in
training mode with its default dropouts (layer drop and SpecAugment off: a Python
branch on a draw and NumPy draws, which remat-ir refuses by line). Each is a few
thousand parameters: the sweep looks for models that train otherwise than eager, not
for speed. Families of `zoo_models` and `tests/torch_models.py` are left out, as are
those whose tiny config fails in eager PyTorch itself (dbrx, zamba, bit, cvt at
transformers 5.24)."""
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
                                 num_conv_pos_embedding_groups=2, mask_time_prob=0.0,
                                 mask_feature_prob=0.0, layerdrop=0.0, pad_token_id=0,
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
                           mask_time_prob=0.0, mask_feature_prob=0.0, encoder_layerdrop=0.0,
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
    "wavlm": ctc(T.WavLMConfig, T.WavLMForCTC, num_buckets=16, max_bucket_distance=32),
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
