//! GPU-equivalents (GE): one unit across whole GPUs, MIG devices and memory slices, so that a
//! team's devices of every sharing policy add up ("12 GPUs' worth") and a team budget can hold
//! them together (`spec.budget.gpuEquivalents`).
//!
//! One device of a policy is, in GE: what the policy states (`spec.gpuEquivalent`, e.g. 0.6 for
//! an A100 beside H100s at 1); else, derived from what its devices are:
//! - a memory slice: the slice's share of its GPU's memory (10Gi of an 81559Mi H100: 0.13);
//! - a MIG device that draws on its GPU's counters: its share of the GPU's multiprocessors
//!   (memory where the driver publishes no multiprocessors counter);
//! - another MIG device: its profile's compute slices of the 7 of an A100 or H100 (`3g.40gb`:
//!   3/7), the largest of the policy's `migProfiles`;
//! - a whole device, time-sliced or shared by MPS too: 1. A DRA claim holds the whole device;
//!   time-slicing and MPS share it between that claim's containers, not between claims.
//!
//! A policy whose devices differ (two GPU models, several MIG profiles) takes its largest
//! share, so that a budget never lets more run than it says. Amounts are kept in millionths.

use super::policies::CompiledPolicy;
use super::shared_counters::SharedCounters;
use crate::api::DeviceType;

/// One GE in the units this module counts in.
pub const MICRO: u64 = 1_000_000;

/// GPU-equivalents of one device of a policy, and where the number comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerDevice {
    /// In millionths of a GE.
    pub micro: u64,
    pub source: Source,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `spec.gpuEquivalent`.
    Stated,
    /// A whole device.
    WholeDevice,
    /// The largest share of its GPU a matching device is (counters, or a slice's memory).
    ShareOfGpu,
    /// The largest `migProfiles` entry's compute slices, of 7.
    MigProfile,
    /// A MIG or slice policy whose share could not be told (no matching device, no profile):
    /// counted as a whole GPU until it can.
    Unknown,
}

impl Source {
    /// How a person reads where the number comes from.
    pub fn describe(self) -> &'static str {
        match self {
            Source::Stated => "as spec.gpuEquivalent states",
            Source::WholeDevice => "a whole device",
            Source::ShareOfGpu => "the largest share of its GPU a matching device is",
            Source::MigProfile => "its MIG profile's compute slices, of 7",
            Source::Unknown => {
                "1 until a matching device shows its share of a GPU; set spec.gpuEquivalent to say it"
            }
        }
    }
}

/// What one device of `policy` is, in GE; `shared` holds the shares of its devices.
pub fn per_device(policy: &CompiledPolicy, shared: &SharedCounters) -> PerDevice {
    let spec = &policy.policy.spec;
    if let Some(micro) = spec.gpu_equivalent.as_deref().and_then(parse) {
        return PerDevice {
            micro,
            source: Source::Stated,
        };
    }
    let share = shared.shares.get(&policy.name).copied();
    let (micro, source) = match (spec.selector.device_type, share, policy.slice()) {
        (_, Some(share), _) => (share, Source::ShareOfGpu),
        (DeviceType::Mig, None, _) => match largest_profile(&spec.selector.mig_profiles) {
            Some(slices) => (slices * MICRO / 7, Source::MigProfile),
            None => (MICRO, Source::Unknown),
        },
        (_, None, Some(_)) => (MICRO, Source::Unknown),
        _ => (MICRO, Source::WholeDevice),
    };
    PerDevice {
        micro: micro.max(1),
        source,
    }
}

/// [`per_device`] of every policy, by name.
pub fn per_policy(
    policies: &[CompiledPolicy],
    shared: &SharedCounters,
) -> std::collections::BTreeMap<String, PerDevice> {
    (policies.iter())
        .map(|p| (p.name.clone(), per_device(p, shared)))
        .collect()
}

/// The compute slices of the largest of `profiles` (`3g.40gb` is 3, capped at 7).
fn largest_profile(profiles: &[String]) -> Option<u64> {
    (profiles.iter())
        .filter_map(|p| p.split_once('g')?.0.parse::<u64>().ok())
        .map(|n| n.min(7))
        .max()
}

/// A decimal such as `0.6` or `12`, in millionths; `None` unless positive and well formed (the
/// CRD's pattern allows six decimals).
pub fn parse(decimal: &str) -> Option<u64> {
    let (whole, fraction) = decimal.split_once('.').unwrap_or((decimal, "0"));
    if whole.is_empty()
        || fraction.is_empty()
        || fraction.len() > 6
        || !(whole.chars().chain(fraction.chars())).all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let fraction: u64 = format!("{fraction:0<6}").parse().ok()?;
    Some(whole.checked_mul(MICRO)?.checked_add(fraction)?).filter(|m| *m > 0)
}

/// `devices` of `per_device` millionths each, in millionths.
pub fn of(devices: u32, per_device: u64) -> u128 {
    u128::from(devices) * u128::from(per_device)
}

/// `micro` millionths as a person reads them: two decimals at most, rounded half up, without
/// trailing zeros (`12`, `12.5`, `0.14`).
pub fn format(micro: u128) -> String {
    let hundredths = (micro + 5_000) / 10_000;
    let (whole, rest) = (hundredths / 100, hundredths % 100);
    match rest {
        0 => whole.to_string(),
        r if r % 10 == 0 => format!("{whole}.{}", r / 10),
        r => format!("{whole}.{r:02}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_parse_to_millionths_and_read_back_with_two_decimals() {
        assert_eq!(parse("0.6"), Some(600_000));
        assert_eq!(parse("12"), Some(12 * MICRO));
        assert_eq!(parse("0.142857"), Some(142_857));
        for bad in ["", ".5", "1.", "0", "0.0", "1.2345678", "-1", "1e3", "1,5"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(format(of(12, 600_000)), "7.2");
        assert_eq!(format(of(7, 142_858)), "1");
        assert_eq!(format(of(1, 125_540)), "0.13");
        assert_eq!(format(0), "0");
        assert_eq!(format(u128::from(MICRO) / 2), "0.5");
    }

    #[test]
    fn a_mig_profiles_compute_slices_are_its_share_of_seven() {
        let profiles = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(largest_profile(&profiles(&["1g.10gb", "3g.40gb"])), Some(3));
        assert_eq!(largest_profile(&profiles(&["1g.10gb+me"])), Some(1));
        assert_eq!(largest_profile(&profiles(&["weird"])), None);
    }
}
