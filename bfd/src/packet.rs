//! The BFD control packet (RFC 5880 §4.1): checked decoding and encoding.
//!
//! Decoding applies the checks of §6.8.6 that need no session (version, length, detect
//! multiplier, multipoint, discriminators, authentication); each failure is its own
//! [`DecodeError`] so the daemon can count why it dropped a packet. Reads go through
//! `get`/`u32_at`, which can fail but never index out of bounds.

use thiserror::Error;

/// Length of a control packet without authentication section (the only kind we accept).
pub const PACKET_LEN: usize = 24;
/// The protocol version this codec speaks.
pub const VERSION: u8 = 1;

/// A session state as carried in the Sta field (§4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    AdminDown,
    Down,
    Init,
    Up,
}

impl State {
    pub(crate) fn from_bits(b: u8) -> State {
        match b & 0b11 {
            0 => State::AdminDown,
            1 => State::Down,
            2 => State::Init,
            _ => State::Up,
        }
    }
    fn bits(self) -> u8 {
        match self {
            State::AdminDown => 0,
            State::Down => 1,
            State::Init => 2,
            State::Up => 3,
        }
    }
    /// Lower-case name, as `bgpctl` and the metrics show it.
    pub fn name(self) -> &'static str {
        match self {
            State::AdminDown => "admindown",
            State::Down => "down",
            State::Init => "init",
            State::Up => "up",
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The diagnostic code (§4.1): why the sender's session last left Up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Diag {
    None,
    ControlDetectionTimeExpired,
    EchoFailed,
    NeighborSignaledDown,
    ForwardingPlaneReset,
    PathDown,
    ConcatenatedPathDown,
    AdministrativelyDown,
    ReverseConcatenatedPathDown,
    /// 9-31, reserved: kept so the packet re-encodes as received.
    Reserved(u8),
}

impl Diag {
    fn from_bits(b: u8) -> Diag {
        match b & 0x1f {
            0 => Diag::None,
            1 => Diag::ControlDetectionTimeExpired,
            2 => Diag::EchoFailed,
            3 => Diag::NeighborSignaledDown,
            4 => Diag::ForwardingPlaneReset,
            5 => Diag::PathDown,
            6 => Diag::ConcatenatedPathDown,
            7 => Diag::AdministrativelyDown,
            8 => Diag::ReverseConcatenatedPathDown,
            n => Diag::Reserved(n),
        }
    }
    fn bits(self) -> u8 {
        match self {
            Diag::None => 0,
            Diag::ControlDetectionTimeExpired => 1,
            Diag::EchoFailed => 2,
            Diag::NeighborSignaledDown => 3,
            Diag::ForwardingPlaneReset => 4,
            Diag::PathDown => 5,
            Diag::ConcatenatedPathDown => 6,
            Diag::AdministrativelyDown => 7,
            Diag::ReverseConcatenatedPathDown => 8,
            Diag::Reserved(n) => n & 0x1f,
        }
    }
    /// A short operator-readable text.
    pub fn text(self) -> &'static str {
        match self {
            Diag::None => "no diagnostic",
            Diag::ControlDetectionTimeExpired => "control detection time expired",
            Diag::EchoFailed => "echo function failed",
            Diag::NeighborSignaledDown => "neighbor signaled session down",
            Diag::ForwardingPlaneReset => "forwarding plane reset",
            Diag::PathDown => "path down",
            Diag::ConcatenatedPathDown => "concatenated path down",
            Diag::AdministrativelyDown => "administratively down",
            Diag::ReverseConcatenatedPathDown => "reverse concatenated path down",
            Diag::Reserved(_) => "reserved diagnostic",
        }
    }
}

/// A decoded, checked control packet. Intervals are in microseconds, as on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlPacket {
    pub diag: Diag,
    pub state: State,
    /// P: the sender asks for a Final (a parameter change, §6.5).
    pub poll: bool,
    /// F: the answer to our Poll.
    pub final_: bool,
    /// C: the sender's BFD does not share fate with its control plane.
    pub control_plane_independent: bool,
    /// D: the sender wishes to run Demand mode (we ignore it, see the crate docs).
    pub demand: bool,
    pub detect_mult: u8,
    pub my_discriminator: u32,
    pub your_discriminator: u32,
    pub desired_min_tx_us: u32,
    pub required_min_rx_us: u32,
    pub required_min_echo_rx_us: u32,
}

/// Why a received datagram is not a control packet we accept (RFC 5880 §6.8.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("datagram of {0} octets is shorter than a BFD control packet (24)")]
    TooShort(usize),
    #[error("version {0}; only BFD version 1 is spoken")]
    BadVersion(u8),
    #[error("length field {0} is below the minimum of 24")]
    LengthTooSmall(u8),
    #[error("length field {field} exceeds the {datagram} octets received")]
    LengthBeyondDatagram { field: u8, datagram: usize },
    #[error("detect multiplier is 0")]
    DetectMultZero,
    #[error("multipoint bit set (RFC 5880 reserves it for future point-to-multipoint use)")]
    Multipoint,
    #[error("my discriminator is 0")]
    MyDiscriminatorZero,
    #[error("your discriminator is 0 while the sender is {0} (only down/admindown may omit it)")]
    YourDiscriminatorZero(State),
    #[error("authentication section present; margay's BFD runs without authentication")]
    Authentication,
}

fn get(b: &[u8], i: usize) -> Result<u8, DecodeError> {
    b.get(i).copied().ok_or(DecodeError::TooShort(b.len()))
}

fn u32_at(b: &[u8], i: usize) -> Result<u32, DecodeError> {
    let end = i.checked_add(4).ok_or(DecodeError::TooShort(b.len()))?;
    let s = b.get(i..end).ok_or(DecodeError::TooShort(b.len()))?;
    let mut a = [0u8; 4];
    a.copy_from_slice(s);
    Ok(u32::from_be_bytes(a))
}

impl ControlPacket {
    /// Decodes one UDP payload. Octets past the Length field are ignored (§6.8.6 only
    /// discards a Length beyond the payload).
    pub fn decode(b: &[u8]) -> Result<ControlPacket, DecodeError> {
        if b.len() < PACKET_LEN {
            return Err(DecodeError::TooShort(b.len()));
        }
        let b0 = get(b, 0)?;
        let version = b0 >> 5;
        if version != VERSION {
            return Err(DecodeError::BadVersion(version));
        }
        let flags = get(b, 1)?;
        let auth = flags & 0x04 != 0;
        let length = get(b, 3)?;
        // The A bit changes the minimum length (26), but we refuse auth anyway; check the
        // length first so a short packet is reported as such.
        if usize::from(length) < PACKET_LEN {
            return Err(DecodeError::LengthTooSmall(length));
        }
        if usize::from(length) > b.len() {
            return Err(DecodeError::LengthBeyondDatagram {
                field: length,
                datagram: b.len(),
            });
        }
        let detect_mult = get(b, 2)?;
        if detect_mult == 0 {
            return Err(DecodeError::DetectMultZero);
        }
        if flags & 0x01 != 0 {
            return Err(DecodeError::Multipoint);
        }
        let state = State::from_bits(flags >> 6);
        let my_discriminator = u32_at(b, 4)?;
        let your_discriminator = u32_at(b, 8)?;
        if my_discriminator == 0 {
            return Err(DecodeError::MyDiscriminatorZero);
        }
        if your_discriminator == 0 && !matches!(state, State::Down | State::AdminDown) {
            return Err(DecodeError::YourDiscriminatorZero(state));
        }
        if auth {
            return Err(DecodeError::Authentication);
        }
        Ok(ControlPacket {
            diag: Diag::from_bits(b0),
            state,
            poll: flags & 0x20 != 0,
            final_: flags & 0x10 != 0,
            control_plane_independent: flags & 0x08 != 0,
            demand: flags & 0x02 != 0,
            detect_mult,
            my_discriminator,
            your_discriminator,
            desired_min_tx_us: u32_at(b, 12)?,
            required_min_rx_us: u32_at(b, 16)?,
            required_min_echo_rx_us: u32_at(b, 20)?,
        })
    }

    /// The 24 octets of this packet (no authentication section).
    pub fn encode(&self) -> [u8; PACKET_LEN] {
        let mut out = [0u8; PACKET_LEN];
        let flags = (self.state.bits() << 6)
            | (u8::from(self.poll) << 5)
            | (u8::from(self.final_) << 4)
            | (u8::from(self.control_plane_independent) << 3)
            | (u8::from(self.demand) << 1);
        let head = [
            (VERSION << 5) | self.diag.bits(),
            flags,
            self.detect_mult,
            PACKET_LEN as u8,
        ];
        let words = [
            self.my_discriminator,
            self.your_discriminator,
            self.desired_min_tx_us,
            self.required_min_rx_us,
            self.required_min_echo_rx_us,
        ];
        for (o, h) in out.iter_mut().zip(head) {
            *o = h;
        }
        for (chunk, w) in out.chunks_exact_mut(4).skip(1).zip(words) {
            chunk.copy_from_slice(&w.to_be_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests;
