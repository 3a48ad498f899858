"""roles and previews: stations.role / revoked_at, jobs.updated_at and preview columns, frames.original_name

Revision ID: 0006_roles_previews
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = '0006_roles_previews'
down_revision = '0005_retention'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('stations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('role', sa.String(length=16), nullable=False, server_default='station'))
        batch_op.add_column(sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('updated_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('preview_etag', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('preview_kind', sa.String(length=16), nullable=True))
        batch_op.create_index(batch_op.f('ix_jobs_updated_at'), ['updated_at'], unique=False)
    with op.batch_alter_table('frames', schema=None) as batch_op:
        batch_op.add_column(sa.Column('original_name', sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('frames', schema=None) as batch_op:
        batch_op.drop_column('original_name')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_updated_at'))
        batch_op.drop_column('preview_kind')
        batch_op.drop_column('preview_etag')
        batch_op.drop_column('updated_at')
    with op.batch_alter_table('stations', schema=None) as batch_op:
        batch_op.drop_column('revoked_at')
        batch_op.drop_column('role')
