//! The one-line explanation of a team's share ([`Explanation`]).

use std::fmt;

/// The numbers behind a team's share. Its `Display` is the one-line explanation, e.g.
/// `8 guaranteed + 3 borrowed of 6 idle at weight 2/5`.
///
/// Rendered on demand (`to_string()`): formatting costs more than computing the whole share,
/// and callers only need the text of teams whose status they write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Explanation {
    pub(super) guaranteed: u32,
    pub(super) effective: u32,
    pub(super) limit: u32,
    pub(super) weight: u32,
    pub(super) requested: u32,
    pub(super) lent: u32,
    /// Devices charged to its claims that fit no node that its other Pods may use (rule 3a).
    pub(super) reused: u32,
    /// Devices charged to its claims that fit no node.
    pub(super) unplaceable: u32,
    pub(super) entitlement: u32,
    pub(super) idle: u32,
    pub(super) lendable: u32,
    pub(super) unused: u32,
    pub(super) reserved: u32,
    pub(super) lending_limit: u32,
    pub(super) borrower_weight: u64,
    pub(super) over_by: u64,
    pub(super) can_borrow: bool,
    pub(super) over_lent: bool,
    /// A department's unused guaranteed devices kept for its own waiting members.
    pub(super) kept_for_members: u32,
    /// Idle devices lent first to teams whose Pods wait, before the rest went by weight.
    pub(super) to_waiting: u32,
    /// The team's own Pods wait for devices it was lent (it borrowed in that first round).
    pub(super) waits: bool,
}

impl Explanation {
    /// The team's unused guarantee that lies among the lendable idle devices.
    fn own_lendable(&self) -> u32 {
        (self.unused).saturating_sub(self.reserved + self.kept_for_members)
    }

    /// Says who borrowed first when teams whose Pods wait were lent devices before the others.
    fn waiting_first(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.to_waiting, self.waits) {
            (0, _) => Ok(()),
            (_, true) => f.write_str(", first: its Pods wait"),
            (first, false) => write!(f, ", after {first} lent first to teams whose Pods wait"),
        }
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} guaranteed", self.effective)?;
        if self.effective < self.guaranteed {
            write!(
                f,
                " (scaled down from {}: guarantees exceed capacity by {})",
                self.guaranteed, self.over_by
            )?;
        }
        let in_use_beyond = self.requested.saturating_sub(self.effective);
        // Lending limits keep some idle devices unlent: say what could be borrowed.
        let pool = if self.lendable < self.idle {
            "lendable idle"
        } else {
            "idle"
        };
        if in_use_beyond > 0 && self.lent > 0 {
            write!(
                f,
                " + {} borrowed ({in_use_beyond} in use, {} more of {} {pool} at weight {}/{})",
                u64::from(in_use_beyond) + u64::from(self.lent),
                self.lent,
                self.lendable,
                self.weight,
                self.borrower_weight
            )?;
            self.waiting_first(f)?;
        } else if in_use_beyond > 0 {
            write!(f, " + {in_use_beyond} borrowed, in use")?;
        } else if self.lent > 0 {
            write!(
                f,
                " + {} borrowed of {} {pool} at weight {}/{}",
                self.lent, self.lendable, self.weight, self.borrower_weight
            )?;
            self.waiting_first(f)?;
        }
        if self.reused > 0 {
            write!(
                f,
                " + {} of the {} its claims that fit no node are charged, for its other Pods",
                self.reused, self.unplaceable
            )?;
        }
        if self.requested > self.limit {
            write!(
                f,
                "; {} in use is above limit {}: quota held at use until claims are released",
                self.requested, self.limit
            )?;
        } else if self.entitlement >= self.limit && self.limit > self.effective {
            write!(f, "; limit {} reached", self.limit)?;
        } else if self.can_borrow && self.lent == 0 {
            if self.idle == 0 {
                f.write_str("; no idle device to borrow")?;
            } else if self.over_lent {
                write!(
                    f,
                    "; nothing lent: the {} idle devices are owed to owners below their guarantee",
                    self.idle
                )?;
            } else if self.lendable == 0 {
                write!(
                    f,
                    "; no idle device to borrow: lending limits keep the {} idle devices unlent",
                    self.idle
                )?;
            } else if self.to_waiting > 0 && !self.waits {
                f.write_str("; the idle devices went to teams whose Pods wait")?;
            } else if self.lendable <= self.own_lendable() {
                // Nobody borrows its own unused guarantee: it may claim it without borrowing.
                f.write_str("; the idle devices are its own unused guarantee")?;
            } else {
                f.write_str(
                    "; the idle devices went to other borrowers, who hold less for their weight",
                )?;
            }
        }
        if self.kept_for_members > 0 {
            write!(
                f,
                "; {} of {} unused kept for its members who wait",
                self.kept_for_members, self.unused
            )?;
        }
        if self.reserved > 0 {
            write!(
                f,
                "; {} of {} unused kept unlent (lending limit {})",
                self.reserved, self.unused, self.lending_limit
            )?;
        }
        Ok(())
    }
}
