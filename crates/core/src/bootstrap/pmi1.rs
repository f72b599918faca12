//! placeholder
/// PMI-1 client.
pub struct Pmi1Client;
impl Pmi1Client { /// From env.
 pub fn from_env() -> crate::Result<Self> { Err(crate::Error::Bootstrap("todo".into())) } }
impl super::Bootstrap for Pmi1Client {
    fn rank(&self) -> crate::Rank { 0 } fn size(&self) -> u32 { 1 } fn job_id(&self) -> &str { "" } fn max_value_len(&self) -> usize { 0 }
    fn put(&mut self, _: &str, _: &str) -> crate::Result<()> { Ok(()) } fn fence(&mut self) -> crate::Result<()> { Ok(()) }
    fn get(&mut self, _: &str) -> crate::Result<String> { Ok(String::new()) } fn finalize(&mut self) -> crate::Result<()> { Ok(()) } fn abort(&mut self, _: i32, _: &str) {}
}
