//! The codec against a corpus of malformed packets (one per §6.8.6 check) and round trips.

use super::*;
use proptest::prelude::*;

fn good() -> ControlPacket {
    ControlPacket {
        diag: Diag::None,
        state: State::Up,
        poll: false,
        final_: false,
        control_plane_independent: false,
        demand: false,
        detect_mult: 3,
        my_discriminator: 7,
        your_discriminator: 9,
        desired_min_tx_us: 100_000,
        required_min_rx_us: 100_000,
        required_min_echo_rx_us: 0,
    }
}

fn with(f: impl FnOnce(&mut [u8; PACKET_LEN])) -> [u8; PACKET_LEN] {
    let mut b = good().encode();
    f(&mut b);
    b
}

#[test]
fn a_good_packet_decodes_to_itself() {
    assert_eq!(ControlPacket::decode(&good().encode()), Ok(good()));
}

#[test]
fn malformed_corpus_is_refused_with_its_reason() {
    let cases: Vec<(&str, Vec<u8>, DecodeError)> = vec![
        ("empty", vec![], DecodeError::TooShort(0)),
        (
            "23 octets",
            good().encode()[..23].to_vec(),
            DecodeError::TooShort(23),
        ),
        (
            "version 0",
            with(|b| b[0] &= 0x1f).to_vec(),
            DecodeError::BadVersion(0),
        ),
        (
            "version 2",
            with(|b| b[0] = (2 << 5) | (b[0] & 0x1f)).to_vec(),
            DecodeError::BadVersion(2),
        ),
        (
            "length 23",
            with(|b| b[3] = 23).to_vec(),
            DecodeError::LengthTooSmall(23),
        ),
        (
            "length beyond datagram",
            with(|b| b[3] = 48).to_vec(),
            DecodeError::LengthBeyondDatagram {
                field: 48,
                datagram: 24,
            },
        ),
        (
            "detect mult 0",
            with(|b| b[2] = 0).to_vec(),
            DecodeError::DetectMultZero,
        ),
        (
            "multipoint",
            with(|b| b[1] |= 0x01).to_vec(),
            DecodeError::Multipoint,
        ),
        (
            "my discriminator 0",
            with(|b| b[4..8].fill(0)).to_vec(),
            DecodeError::MyDiscriminatorZero,
        ),
        (
            "your discriminator 0 while up",
            with(|b| b[8..12].fill(0)).to_vec(),
            DecodeError::YourDiscriminatorZero(State::Up),
        ),
        (
            "your discriminator 0 while init",
            with(|b| {
                b[8..12].fill(0);
                b[1] = (b[1] & 0x3f) | (2 << 6);
            })
            .to_vec(),
            DecodeError::YourDiscriminatorZero(State::Init),
        ),
        (
            "authentication",
            {
                let mut v = with(|b| {
                    b[1] |= 0x04;
                    b[3] = 26;
                })
                .to_vec();
                v.extend([1, 2]);
                v
            },
            DecodeError::Authentication,
        ),
    ];
    for (name, bytes, want) in cases {
        assert_eq!(ControlPacket::decode(&bytes), Err(want), "{name}");
        // Every refusal has an operator-readable reason.
        assert!(!want.to_string().is_empty(), "{name}");
    }
}

#[test]
fn your_discriminator_zero_is_fine_while_down() {
    let b = with(|b| {
        b[8..12].fill(0);
        b[1] = (b[1] & 0x3f) | (1 << 6);
    });
    let p = ControlPacket::decode(&b).expect("down with your discriminator 0 is legal");
    assert_eq!((p.state, p.your_discriminator), (State::Down, 0));
}

#[test]
fn octets_past_the_length_are_ignored() {
    let mut v = good().encode().to_vec();
    v.extend([0xff; 8]);
    assert_eq!(ControlPacket::decode(&v), Ok(good()));
}

fn any_state() -> impl Strategy<Value = State> {
    prop_oneof![
        Just(State::AdminDown),
        Just(State::Down),
        Just(State::Init),
        Just(State::Up)
    ]
}

proptest! {
    #[test]
    fn any_bytes_give_a_value_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(p) = ControlPacket::decode(&bytes) {
            // Whatever decodes re-encodes to something that decodes the same.
            prop_assert_eq!(ControlPacket::decode(&p.encode()), Ok(p));
        }
    }

    #[test]
    fn valid_packets_round_trip(
        diag in 0u8..32, state in any_state(), poll: bool, final_: bool, cpi: bool, demand: bool,
        mult in 1u8..=255, my in 1u32.., your: u32, tx: u32, rx: u32, echo: u32,
    ) {
        let your = if matches!(state, State::Down | State::AdminDown) { your } else { your.max(1) };
        let p = ControlPacket {
            diag: Diag::from_bits(diag), state, poll, final_, control_plane_independent: cpi,
            demand, detect_mult: mult, my_discriminator: my, your_discriminator: your,
            desired_min_tx_us: tx, required_min_rx_us: rx, required_min_echo_rx_us: echo,
        };
        prop_assert_eq!(ControlPacket::decode(&p.encode()), Ok(p));
    }
}
