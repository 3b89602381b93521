//! What the agent asks of the host, as one trait: [`Host`] is the rtnetlink reads and writes
//! of `kernel` and the nft tables of `nat` and `policy`, as far as the agent calls them.
//! [`System`] is the real host (one netlink socket, the `nft` binary) and what the daemon
//! runs; the agent's unit tests drive a recording fake instead, and the namespace suite
//! (interop-tests) checks the real one end to end. The sysctls are not here: `Sysctls` takes
//! its root directory already.

use std::net::IpAddr;

use host_kernel::netlink::NlError;
use net_types::IpFamily;
use proto::mac::Mac;

use super::config::RoutewriterConfig;
use super::kernel::{Kernel, Refusal};
use super::nat::{NatDesired, Nft};
use super::nft::{NftError, Tables};
use super::policy::{PolicyState, PolicyTable};
use super::reconcile::{
    ActualFdb, ActualLink, ActualNeigh, ActualRoute, DeviceSpec, FdbOp, NeighOp, RouteOp,
};

/// The kernel as the agent reads and writes it. Batched writes answer with the refusals by
/// index in the batch; a whole call fails only when the socket or the dump did.
pub trait Host {
    /// Netlink messages sent that change kernel state.
    fn netlink_writes(&self) -> u64;
    fn links(&mut self) -> Result<Vec<ActualLink>, NlError>;
    /// `None` when no link has that name.
    fn link(&mut self, name: &str) -> Result<Option<ActualLink>, NlError>;
    /// Every route of `family` in `table` (only those through `oif` when given), to `f`.
    fn routes(
        &mut self,
        family: IpFamily,
        table: u32,
        oif: Option<u32>,
        f: impl FnMut(&ActualRoute),
    ) -> Result<(), NlError>;
    fn apply_routes(
        &mut self,
        ops: &[RouteOp],
        table: u32,
        protocol: u8,
    ) -> Result<Vec<Refusal>, NlError>;
    /// Creates the VXLAN device; its index.
    fn create_vxlan(&mut self, spec: &DeviceSpec) -> Result<u32, NlError>;
    fn set_link(
        &mut self,
        index: u32,
        mtu: Option<u32>,
        mac: Option<Mac>,
        up: bool,
    ) -> Result<(), NlError>;
    fn delete_link(&mut self, index: u32) -> Result<(), NlError>;
    /// The IPIP device's index, made when missing ([`NlError::Missing`] without IPIP).
    fn ensure_ipip(&mut self, name: &str) -> Result<u32, NlError>;
    /// Every address of `family`: interface index, address, prefix length.
    fn all_addresses(&mut self, family: IpFamily) -> Result<Vec<(u32, IpAddr, u8)>, NlError>;
    fn add_address(&mut self, index: u32, addr: IpAddr, len: u8) -> Result<(), NlError>;
    fn del_address(&mut self, index: u32, addr: IpAddr, len: u8) -> Result<(), NlError>;
    fn neighbours(&mut self, index: u32, family: IpFamily) -> Result<Vec<ActualNeigh>, NlError>;
    fn fdb(&mut self, index: u32) -> Result<Vec<ActualFdb>, NlError>;
    fn apply_neighbours(&mut self, index: u32, ops: &[NeighOp]) -> Result<Vec<Refusal>, NlError>;
    fn apply_fdb(&mut self, index: u32, ops: &[FdbOp]) -> Result<Vec<Refusal>, NlError>;

    /// The namespace's nftables tables, listed once for a full sync.
    fn nft_tables(&self) -> Result<Tables, NftError>;
    /// natOutgoing's table of `family` made to match `desired` (`None`: removed); true when
    /// something was written. `known`: the tables, when listed (an absent one is not read).
    fn sync_nat(
        &mut self,
        family: IpFamily,
        desired: Option<&NatDesired>,
        known: Option<&Tables>,
    ) -> Result<bool, NftError>;
    /// The policy table made to render `state`, planned against the kernel's table when
    /// `read_back` (else against the last write); true when something was written.
    fn sync_policy(
        &mut self,
        state: &PolicyState,
        read_back: bool,
        known: Option<&Tables>,
    ) -> Result<bool, NftError>;
    /// nft transactions run, both tables.
    fn nft_writes(&self) -> u64;

    /// Addresses of `family` on interface `index`.
    fn addresses(&mut self, index: u32, family: IpFamily) -> Result<Vec<(IpAddr, u8)>, NlError> {
        Ok(self
            .all_addresses(family)?
            .into_iter()
            .filter(|(i, _, _)| *i == index)
            .map(|(_, a, l)| (a, l))
            .collect())
    }
}

/// The real host: the netlink socket of the calling thread's namespace and `nft`.
pub struct System {
    pub kernel: Kernel,
    nat: Nft,
    policy: PolicyTable,
}

impl System {
    /// Opens the netlink socket; nft runs only when a table is synced.
    pub fn open(cfg: &RoutewriterConfig) -> Result<System, NlError> {
        Ok(System {
            kernel: Kernel::open()?,
            nat: Nft::new(&cfg.nft, &cfg.nat_table),
            policy: PolicyTable::new(&cfg.nft, &cfg.policy_table),
        })
    }
}

impl Host for System {
    fn netlink_writes(&self) -> u64 {
        self.kernel.writes()
    }
    fn links(&mut self) -> Result<Vec<ActualLink>, NlError> {
        self.kernel.links()
    }
    fn link(&mut self, name: &str) -> Result<Option<ActualLink>, NlError> {
        self.kernel.link(name)
    }
    fn routes(
        &mut self,
        family: IpFamily,
        table: u32,
        oif: Option<u32>,
        f: impl FnMut(&ActualRoute),
    ) -> Result<(), NlError> {
        self.kernel.routes(family, table, oif, f)
    }
    fn apply_routes(
        &mut self,
        ops: &[RouteOp],
        table: u32,
        protocol: u8,
    ) -> Result<Vec<Refusal>, NlError> {
        self.kernel.apply_routes(ops, table, protocol)
    }
    fn create_vxlan(&mut self, spec: &DeviceSpec) -> Result<u32, NlError> {
        self.kernel.create_vxlan(spec)
    }
    fn set_link(
        &mut self,
        index: u32,
        mtu: Option<u32>,
        mac: Option<Mac>,
        up: bool,
    ) -> Result<(), NlError> {
        self.kernel.set_link(index, mtu, mac, up)
    }
    fn delete_link(&mut self, index: u32) -> Result<(), NlError> {
        self.kernel.delete_link(index)
    }
    fn ensure_ipip(&mut self, name: &str) -> Result<u32, NlError> {
        self.kernel.ensure_ipip(name)
    }
    fn all_addresses(&mut self, family: IpFamily) -> Result<Vec<(u32, IpAddr, u8)>, NlError> {
        self.kernel.all_addresses(family)
    }
    fn add_address(&mut self, index: u32, addr: IpAddr, len: u8) -> Result<(), NlError> {
        self.kernel.add_address(index, addr, len)
    }
    fn del_address(&mut self, index: u32, addr: IpAddr, len: u8) -> Result<(), NlError> {
        self.kernel.del_address(index, addr, len)
    }
    fn neighbours(&mut self, index: u32, family: IpFamily) -> Result<Vec<ActualNeigh>, NlError> {
        self.kernel.neighbours(index, family)
    }
    fn fdb(&mut self, index: u32) -> Result<Vec<ActualFdb>, NlError> {
        self.kernel.fdb(index)
    }
    fn apply_neighbours(&mut self, index: u32, ops: &[NeighOp]) -> Result<Vec<Refusal>, NlError> {
        self.kernel.apply_neighbours(index, ops)
    }
    fn apply_fdb(&mut self, index: u32, ops: &[FdbOp]) -> Result<Vec<Refusal>, NlError> {
        self.kernel.apply_fdb(index, ops)
    }
    fn nft_tables(&self) -> Result<Tables, NftError> {
        // Both tables' runners run the same binary.
        self.nat.runner.tables()
    }
    fn sync_nat(
        &mut self,
        family: IpFamily,
        desired: Option<&NatDesired>,
        known: Option<&Tables>,
    ) -> Result<bool, NftError> {
        self.nat.sync(family, desired, known)
    }
    fn sync_policy(
        &mut self,
        state: &PolicyState,
        read_back: bool,
        known: Option<&Tables>,
    ) -> Result<bool, NftError> {
        self.policy.sync(state, read_back, known)
    }
    fn nft_writes(&self) -> u64 {
        self.nat.writes() + self.policy.runner.writes
    }
}
