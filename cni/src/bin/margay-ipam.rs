//! `margay-ipam`: the IPAM plugin, addresses from bgpd (a build output of its own, so that
//! installing is a plain copy).

fn main() {
    std::process::exit(cni::run(cni::Plugin::Ipam));
}
