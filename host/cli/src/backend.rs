//! Which Burn backend the policy runs on. `flex` (CPU) is always built;
//! `wgpu` (Vulkan, Metal, DX12; Mesa's lavapipe on a machine without a GPU)
//! and `cuda` are cargo features of ragen-host, so a default build stays
//! small and needs no GPU toolchain. `libtorch` (cargo feature `libtorch`)
//! runs Burn's LibTorch backend on the CPU, PyTorch's own kernels: it builds
//! against the PyTorch wheel of a Python environment (see docs/results.md,
//! "Policy speed"), so it is never part of a default build or of CI.

use clap::ValueEnum;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// Burn's pure-Rust CPU backend (threads and SIMD).
    Flex,
    /// Burn's WebGPU backend (cargo feature `wgpu`).
    Wgpu,
    /// Burn's CUDA backend (cargo feature `cuda`).
    Cuda,
    /// Burn's LibTorch backend on the CPU (cargo feature `libtorch`; needs
    /// PyTorch's libraries at build and run time).
    Libtorch,
}

impl BackendChoice {
    pub fn name(self) -> &'static str {
        match self {
            Self::Flex => "flex",
            Self::Wgpu => "wgpu",
            Self::Cuda => "cuda",
            Self::Libtorch => "libtorch",
        }
    }

    /// Whether this binary was built with the backend.
    pub fn built(self) -> bool {
        match self {
            Self::Flex => true,
            Self::Wgpu => cfg!(feature = "wgpu"),
            Self::Cuda => cfg!(feature = "cuda"),
            Self::Libtorch => cfg!(feature = "libtorch"),
        }
    }

    /// The error for a backend this binary lacks.
    pub fn missing(self) -> anyhow::Error {
        anyhow::anyhow!(
            "backend `{0}` is not in this build of ragen-host; rebuild with the cargo feature: \
             `cargo build --release -p ragen-host --features {0}`",
            self.name()
        )
    }
}

/// The backend's default device (the first GPU, or the CPU).
pub fn default_device<B: burn::tensor::backend::Backend>() -> B::Device {
    Default::default()
}

/// Make one small tensor on `device` and read it back. GPU backends panic
/// (on another thread, too) when no driver or adapter is there; this turns
/// that into an error a person can act on, before any work starts.
#[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]
pub fn probe<B: burn::tensor::backend::Backend>(choice: BackendChoice, device: &B::Device) -> anyhow::Result<()> {
    use burn::tensor::Tensor;
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let device = device.clone();
    // The probe shares nothing with the rest of the program, so a panic
    // inside it leaves no broken state behind.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || Tensor::<B, 1>::ones([4], &device).sum().into_scalar()));
    std::panic::set_hook(quiet);
    match result {
        Ok(_) => Ok(()),
        Err(_) => Err(anyhow::anyhow!(
            "backend `{0}` is built in but could not start: {1}; use `--backend flex` to run on the CPU",
            choice.name(),
            match choice {
                BackendChoice::Cuda => "no CUDA driver was found (libcuda.so; is the NVIDIA driver installed and LD_LIBRARY_PATH set?)",
                _ =>
                    "no GPU adapter was found (on a machine without a GPU, install a Vulkan driver such as Mesa's lavapipe: mesa-vulkan-drivers)",
            }
        )),
    }
}

/// Run `$body` with `$B` the backend chosen and `$device` its default
/// device; a backend not built in is an error naming the feature. Plain
/// `with_backend!(choice, B, device => body)` gives the autodiff backend
/// (training); `with_backend!(inference choice, ...)` the backend itself,
/// whose fused kernels (flash attention on flex) sampling wants.
macro_rules! with_backend {
    (inference $choice:expr, $B:ident, $device:ident => $body:expr) => {
        $crate::backend::with_backend!(@wrap [], $choice, $B, $device => $body)
    };
    ($choice:expr, $B:ident, $device:ident => $body:expr) => {
        $crate::backend::with_backend!(@wrap [burn::backend::Autodiff], $choice, $B, $device => $body)
    };
    (@wrap [$($wrap:tt)*], $choice:expr, $B:ident, $device:ident => $body:expr) => {{
        use $crate::backend::BackendChoice;
        match $choice {
            BackendChoice::Flex => {
                type $B = $crate::backend::with_backend!(@type [$($wrap)*] burn::backend::Flex);
                let $device = $crate::backend::default_device::<$B>();
                $body
            }
            #[cfg(feature = "wgpu")]
            BackendChoice::Wgpu => {
                type $B = $crate::backend::with_backend!(@type [$($wrap)*] burn::backend::Wgpu);
                let $device = $crate::backend::default_device::<$B>();
                $crate::backend::probe::<$B>(BackendChoice::Wgpu, &$device)?;
                $body
            }
            #[cfg(feature = "cuda")]
            BackendChoice::Cuda => {
                type $B = $crate::backend::with_backend!(@type [$($wrap)*] burn::backend::Cuda);
                let $device = $crate::backend::default_device::<$B>();
                $crate::backend::probe::<$B>(BackendChoice::Cuda, &$device)?;
                $body
            }
            #[cfg(feature = "libtorch")]
            BackendChoice::Libtorch => {
                type $B = $crate::backend::with_backend!(@type [$($wrap)*] burn::backend::LibTorch);
                let $device = $crate::backend::default_device::<$B>();
                $body
            }
            #[allow(unreachable_patterns)]
            other => return Err(other.missing()),
        }
    }};
    (@type [] $inner:ty) => { $inner };
    (@type [$($wrap:tt)+] $inner:ty) => { $($wrap)+<$inner> };
}
pub(crate) use with_backend;
