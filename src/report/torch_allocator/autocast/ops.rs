//! What `torch.autocast` does to each op, by the class of the autograd node the op made (the
//! class names are PyTorch's, `torch/csrc/autograd/generated`), and what each class keeps for
//! its backward. From PyTorch's autocast op lists (`aten/src/ATen/autocast_mode.cpp`, CUDA) and
//! its derivatives (`tools/autograd/derivatives.yaml`), as `docs/fit.md` says.

/// Ops autocast runs in 16 bits, casting their 32-bit inputs: matrix products, convolutions,
/// attention.
const SIXTEEN: &[&str] = &[
    "AddmmBackward0",
    "MmBackward0",
    "BmmBackward0",
    "BaddbmmBackward0",
    "AddbmmBackward0",
    "AddmvBackward0",
    "MvBackward0",
    "AddrBackward0",
    "DotBackward0",
    "VdotBackward0",
    "LinearBackward0",
    "ConvolutionBackward0",
    "CudnnConvolutionBackward0",
    "ConvolutionBackwardOverrideable",
    "CudnnConvolutionTransposeBackward0",
    "PreluKernelBackward0",
    "ScaledDotProductEfficientAttentionBackward0",
    "ScaledDotProductFlashAttentionBackward0",
    "ScaledDotProductCudnnAttentionBackward0",
    "EfficientAttentionBackward0",
    "FlashAttentionBackward0",
];

/// Ops autocast runs in 32 bits, casting their 16-bit inputs: powers, exponentials and logs,
/// normalizations, softmax, sums and losses.
const THIRTY_TWO: &[&str] = &[
    "PowBackward0",
    "PowBackward1",
    "PowBackward2",
    "ExpBackward0",
    "Expm1Backward0",
    "LogBackward0",
    "Log2Backward0",
    "Log10Backward0",
    "Log1PBackward0",
    "ReciprocalBackward0",
    "RsqrtBackward0",
    "SinhBackward0",
    "CoshBackward0",
    "TanBackward0",
    "AcosBackward0",
    "AsinBackward0",
    "ErfinvBackward0",
    "SoftplusBackward0",
    "NativeLayerNormBackward0",
    "NativeGroupNormBackward0",
    "SoftmaxBackward0",
    "LogSoftmaxBackward0",
    "CumsumBackward0",
    "CumprodBackward0",
    "SumBackward0",
    "SumBackward1",
    "ProdBackward0",
    "ProdBackward1",
    "NormBackward0",
    "NormBackward1",
    "LinalgVectorNormBackward0",
    "LogsumexpBackward0",
    "NllLossBackward0",
    "NllLoss2DBackward0",
    "MseLossBackward0",
    "L1LossBackward0",
    "SmoothL1LossBackward0",
    "HuberLossBackward0",
    "BinaryCrossEntropyWithLogitsBackward0",
    "KlDivBackward0",
    "CdistBackward0",
    "DistBackward0",
    "RenormBackward0",
    "UpsampleNearest2DBackward0",
    "UpsampleBilinear2DBackward0",
];

/// Ops whose output is a view of their input: no memory of their own.
const VIEWS: &[&str] = &[
    "ViewBackward0",
    "UnsafeViewBackward0",
    "ReshapeAliasBackward0",
    "TBackward0",
    "TransposeBackward0",
    "PermuteBackward0",
    "UnsqueezeBackward0",
    "SqueezeBackward0",
    "SqueezeBackward1",
    "SqueezeBackward2",
    "AliasBackward0",
    "ExpandBackward0",
    "SelectBackward0",
    "SliceBackward0",
    "SplitBackward0",
    "SplitWithSizesBackward0",
    "UnbindBackward0",
    "AsStridedBackward0",
    "UnflattenBackward0",
];

/// Ops whose output takes the type of their first input whatever their parameters' (batch
/// normalization runs a 16-bit input with 32-bit weights, casting nothing).
const AS_INPUT: &[&str] = &[
    "NativeBatchNormBackward0",
    "CudnnBatchNormBackward0",
    "MiopenBatchNormBackward0",
];

/// Ops that make their output before a larger tensor they also keep (max pooling's indices,
/// 64-bit, twice a 32-bit output).
const OUTPUT_FIRST: &[&str] = &[
    "MaxPool2DWithIndicesBackward0",
    "MaxPool3DWithIndicesBackward0",
    "AdaptiveMaxPool2DBackward0",
    "AdaptiveMaxPool3DBackward0",
];

/// Whether an op of `class` makes its output first among what it keeps.
pub fn output_first(class: &str) -> bool {
    OUTPUT_FIRST.contains(&class)
}

/// How autocast runs an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cast {
    /// In 16 bits, its 32-bit inputs cast down.
    Sixteen,
    /// In 32 bits, its 16-bit inputs cast up.
    ThirtyTwo,
    /// In its first input's type, casting nothing.
    AsInput,
    /// As its inputs are: 16 bits where every input that takes a gradient is.
    Follows,
}

pub fn cast_of(class: &str) -> Cast {
    if SIXTEEN.contains(&class) {
        Cast::Sixteen
    } else if THIRTY_TWO.contains(&class) {
        Cast::ThirtyTwo
    } else if AS_INPUT.contains(&class) {
        Cast::AsInput
    } else {
        Cast::Follows
    }
}

pub fn is_view(class: &str) -> bool {
    VIEWS.contains(&class)
}

/// Whether an op of `class` keeps its input `i` for its backward; `other_takes_gradient`: the
/// op's other input (of two) takes a gradient.
pub fn saves(class: &str, i: usize, other_takes_gradient: bool) -> bool {
    match class {
        "AddmmBackward0" | "BaddbmmBackward0" | "AddbmmBackward0" => i == 1 || i == 2,
        "MmBackward0" | "BmmBackward0" | "DotBackward0" | "VdotBackward0" | "DivBackward0" => {
            i <= 1
        }
        "ConvolutionBackward0" | "CudnnConvolutionBackward0" => i <= 1,
        "NativeLayerNormBackward0"
        | "NativeGroupNormBackward0"
        | "NativeBatchNormBackward0"
        | "CudnnBatchNormBackward0"
        | "PowBackward0"
        | "GeluBackward0"
        | "SiluBackward0"
        | "NllLossBackward0"
        | "NllLoss2DBackward0"
        | "MseLossBackward0"
        | "BinaryCrossEntropyWithLogitsBackward0" => i == 0,
        "ScaledDotProductEfficientAttentionBackward0"
        | "ScaledDotProductFlashAttentionBackward0"
        | "ScaledDotProductCudnnAttentionBackward0" => i <= 2,
        // Each factor is kept for the other's gradient.
        "MulBackward0" => other_takes_gradient,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lists_name_each_class_once() {
        let lists = SIXTEEN
            .iter()
            .chain(THIRTY_TWO)
            .chain(VIEWS)
            .chain(AS_INPUT);
        let mut all: Vec<&str> = lists.copied().collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
        assert_eq!(cast_of("MmBackward0"), Cast::Sixteen);
        assert_eq!(cast_of("NativeLayerNormBackward0"), Cast::ThirtyTwo);
        assert_eq!(cast_of("AddBackward0"), Cast::Follows);
        assert!(saves("MulBackward0", 0, true) && !saves("MulBackward0", 0, false));
        assert!(saves("AddmmBackward0", 2, false) && !saves("AddmmBackward0", 0, false));
    }
}
