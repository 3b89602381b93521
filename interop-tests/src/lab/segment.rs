//! An L2 segment for tests with more than two speakers: a bridge in its own namespace, and
//! members (one namespace each) attached by veth with an address on the segment. Dropping a
//! member removes its link and namespace; dropping the segment removes the bridge.

use super::netns::{CmdError, Netns, VethPair};

pub struct Segment {
    pub hub: Netns,
}

/// One namespace on the segment.
pub struct Member {
    _veth: VethPair,
    pub ns: Netns,
    pub addr: String,
}

impl Segment {
    pub fn new(tag: &str) -> Result<Segment, CmdError> {
        let hub = Netns::new(tag)?;
        hub.ip(&["link", "add", "br0", "type", "bridge"])?;
        hub.ip(&["link", "set", "br0", "up"])?;
        Ok(Segment { hub })
    }

    /// A namespace named `tag` with `eth0` on the segment at `addr` (`10.98.0.11/24`).
    pub fn attach(&self, tag: &str, addr: &str) -> Result<Member, CmdError> {
        let ns = Netns::new(tag)?;
        let port = format!("v{tag}");
        let veth = VethPair::new(&ns, "eth0", &self.hub, &port)?;
        self.hub.ip(&["link", "set", &port, "master", "br0"])?;
        ns.ip(&["addr", "add", addr, "dev", "eth0"])?;
        Ok(Member {
            _veth: veth,
            ns,
            addr: addr.split('/').next().unwrap_or(addr).to_owned(),
        })
    }
}
