//! Where loaded tensors live.

use std::fmt;
use std::str::FromStr;

/// A destination for loaded tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// Plain host memory.
    Cpu,
    /// Page-locked host memory (later copies to a GPU run at DMA speed); needs a CUDA driver.
    PinnedCpu,
    /// Memory of CUDA device N.
    Cuda(u32),
}

impl FromStr for Device {
    type Err = String;

    /// `cpu`, `cpu:pinned`, `cuda` (device 0) or `cuda:N`.
    fn from_str(s: &str) -> Result<Device, String> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cpu:pinned" | "pinned" => Ok(Device::PinnedCpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => match t.strip_prefix("cuda:") {
                Some(n) => n.parse().map(Device::Cuda).map_err(|_| format!("{s:?}: device index must be a number")),
                None => Err(format!("{s:?} is not a device (cpu, cpu:pinned, cuda or cuda:N)")),
            },
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::PinnedCpu => f.write_str("cpu:pinned"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!("cpu".parse(), Ok(Device::Cpu));
        assert_eq!("cpu:pinned".parse(), Ok(Device::PinnedCpu));
        assert_eq!("CUDA".parse(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(Device::Cuda(3)));
        assert!("cuda:x".parse::<Device>().is_err());
        assert!("tpu".parse::<Device>().is_err());
        assert_eq!(Device::Cuda(2).to_string(), "cuda:2");
    }
}
